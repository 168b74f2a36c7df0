"""Hugging Face Spaces entry point: the module-level ``demo`` is the whole app (explorer/app/ui.py)."""

import os

from explorer.app.ui import build_demo

demo = build_demo()

if __name__ == "__main__":
    # Local by default; a Space (or a container) sets GRADIO_SERVER_NAME=0.0.0.0.
    demo.launch(server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
