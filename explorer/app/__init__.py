"""The Gradio app: settings and handlers, playback of recorded events, page layout, frames (render) and
figures (plots), the page's prose (text/*.md), and the Spaces bundle (hosting). ``build_demo`` builds it."""
