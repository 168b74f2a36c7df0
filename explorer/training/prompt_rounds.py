"""Rounds 7-14 of the prompt wordings (``prompts.ROUNDS``): two topics per prompt
({t} and a partner {u} from the same split), each template with partners no earlier template used."""

# A seventh round: two topics, with kinds of answer the earlier rounds lack (French, German and
# Spanish answers, numbered steps, summaries, SQL, shell, code review), partners again new to each template.
GENERAL_TEMPLATES_7 = [
    "Explique {t} et {u} en quelques phrases simples.",
    "Erkläre kurz {t} und danach {u}.",
    "Explica {t} y {u} a un estudiante.",
    "List five steps to start learning about {t}, then three steps for {u}.",
    "Summarize what everyone should know about {t} and about {u}, in two short paragraphs.",
    "Write a news headline and a short article about {t} meeting {u}.",
    "What questions would a curious student ask about {t} and {u}? Answer two of them.",
    "Give me one surprising fact about {t} and one about {u}, and explain why each is surprising.",
    "Write a recipe-style guide: how to understand {t}, with {u} as a bonus step.",
    "Write a short speech for a class about {t} and {u}.",
    "Which came first in history, {t} or {u}? Explain what you know about each.",
    "Write a product description for a board game about {t} and {u}.",
    "Give three common misconceptions about {t} and one about {u}, with corrections.",
    "Write a limerick about {t} and a short explanation of {u}.",
    "Explain {t} using an analogy to {u}.",
    "Write a to-do list for a weekend spent learning about {t} and {u}.",
]

PYTHON_TEMPLATES_7 = [
    "Write a SQL query and a Python function: the Python one {t}, and explain how you would store data for a "
    "function that {u}.",
    "Write a Bash script that runs a Python program which {t}, and a Python function that {u}.",
    "Review this plan and write the code: a Python function that {t}, reusing a helper that {u}.",
    "Write a Python function that {t}, then explain step by step how to adapt it so that it {u}.",
    "Write a Python dataclass-based solution with one method that {t} and one that {u}.",
    "Write a Swift function that {t} and a Python function that {u}.",
    "Write a Python generator that {t}, and a function that {u}, with type hints.",
    "Write a PHP function that {t} and a Lua function that {u}.",
]

# An eighth round: follow-up questions written as one turn, definitions, pros and cons,
# and more code in other languages.
GENERAL_TEMPLATES_8 = [
    "You explained {t} to me yesterday. Can you now explain {u} in the same way?",
    "Define {t} and {u} in one sentence each, then give an example of each.",
    "What are the pros and cons of learning about {t} before {u}?",
    "Write a short interview with an expert on {t} who also knows about {u}.",
    "Create a study plan for one week: three days on {t}, four days on {u}.",
    "Tell a short fairy tale in which {t} and {u} are characters.",
    "Write five flashcards, question and answer, about {t} and {u}.",
    "How would you explain {t} to someone who only knows about {u}?",
    "Write a short email inviting friends to a talk about {t} and {u}.",
    "Spiega brevemente {t} e {u}.",
    "Explique {t} e {u} em poucas frases.",
    "List the key words someone should know about {t}, then about {u}, with short definitions.",
]

PYTHON_TEMPLATES_8 = [
    "Write a Python function that {t}. Then write a second version that {u}, and compare them.",
    "Write a Haskell function that {t} and a Python function that {u}.",
    "Write a Python function that {t}, with doctest examples, and another that {u}.",
    "Explain, then write, a Python function that {t}; finish with a function that {u}.",
    "Write an R function that {t} and a Python function that {u}.",
    "Write a Python async function that {t}, and a normal function that {u}.",
]

# Rounds nine and ten: more two-topic kinds (explain-like-a-teacher, timelines, checklists,
# arguments for and against, code with tests and complexity), so the data can keep growing without repeats.
GENERAL_TEMPLATES_9 = [
    "Write a lesson introduction about {t} that ends with a question about {u}.",
    "Make a timeline of the most important moments for {t}, then one for {u}.",
    "Write a checklist for a beginner who wants to understand {t} and {u}.",
    "Give one argument for and one against spending a school day on {t} instead of {u}.",
    "Write a short mystery story where the clue is {t} and the answer is {u}.",
    "Explain what {t} and {u} would look like in a hundred years.",
    "Write a short song chorus about {t} and a verse about {u}.",
    "Describe {t} in three words and {u} in three words, then explain your choices.",
    "Write an encyclopedia-style paragraph about {t}, then one about {u}.",
    "What would a scientist say about {t}, and what would an artist say about {u}?",
    "Write a travel guide entry that mentions {t} and {u}.",
    "Explain {t} step by step, then explain how {u} is different.",
    "Erkläre {t} einem Kind und {u} einem Erwachsenen.",
    "Écris un court dialogue sur {t} et {u}.",
    "Write a short advertisement for a course on {t} and {u}.",
    "Answer as a tutor: a student asks how {t} and {u} fit together.",
]

PYTHON_TEMPLATES_9 = [
    "Write a Python function that {t}, its unit tests with unittest, and a function that {u}.",
    "Write a Python function that {t} and state its time and space complexity; then one that {u}.",
    "Write a Python function that {t} without using any imports, and another that {u}.",
    "Write a Kotlin function that {t} and a Python function that {u}.",
    "Write a Python function that {t}, handling invalid input with exceptions, and one that {u}.",
    "Write a Python function that {t} using a loop, and one that {u} using recursion.",
    "Write a Scala function that {t} and a Python function that {u}.",
    "Write a Python class with a method that {t} and a static method that {u}, with a usage example.",
]

GENERAL_TEMPLATES_10 = [
    "Write a short report on {t}, with a section on {u}.",
    "What are three things people often get wrong about {t}? Then give one about {u}.",
    "Give a short answer and a long answer: what is {t}, and what is {u}?",
    "Write a diary entry by someone who spent a day learning about {t} and {u}.",
    "Compare {t} and {u} in a table with three rows.",
    "Explain {t} with a numbered list, then {u} with bullet points.",
    "Write a children's book page about {t} and a page about {u}.",
    "How could a teacher use {t} to introduce {u}?",
    "Describe a game that teaches {t}, and a puzzle that teaches {u}.",
    "Write a quiz of four multiple-choice questions about {t} and {u}, with the answers.",
    "Escribe un párrafo sobre {t} y otro sobre {u}.",
    "Write a thank-you note to a teacher who explained {t} and {u}.",
    "What should I know about {t} before I start learning about {u}?",
    "Write a short summary of {t} for a newspaper and of {u} for a blog.",
]

PYTHON_TEMPLATES_10 = [
    "Write a Python function that {t}, then explain each line; then write a function that {u}.",
    "Write a Python function that {t} using list comprehensions, and one that {u} with a for loop.",
    "Write a Dart function that {t} and a Python function that {u}.",
    "Write a Python function that {t} and benchmark it with timeit; then write one that {u}.",
    "Write a Python function that {t} and a Julia function that {u}.",
    "Write a Python script that {t} and logs each step, plus a function that {u}.",
    "Refactor this idea into clean Python: a function that {t} and a function that {u}, with type hints.",
]

# Rounds 11-14: the last 1.9M answer tokens toward the 8M asked. Kinds the earlier rounds lack:
# a question asked back, rewrites for an audience, worked examples, email and notes, error explanations, code
# translated between languages, small command-line tools.
GENERAL_TEMPLATES_11 = [
    "I am confused about {t}. Ask me one question to find out what I know, then explain it, and mention {u}.",
    "Rewrite an explanation of {t} for a ten-year-old, and one of {u} for a university student.",
    "Give a worked example that involves {t}, then one that involves {u}.",
    "Write meeting notes from a club discussion about {t} and {u}.",
    "What is the history of {t} in five sentences? Add two sentences about {u}.",
    "Write a short poem about {t}, then explain in prose how it relates to {u}.",
    "Give me a fun fact, a hard fact and an open question about {t}; one fun fact about {u}.",
    "Explain the most common mistake beginners make with {t} and with {u}.",
    "Write a short persuasive paragraph: why {t} matters more than people think, and why {u} does too.",
    "Describe a day in the life of someone whose job involves {t} and {u}.",
    "Résume {t} en trois points, puis {u} en trois points.",
    "Beschreibe {t} in einem Absatz und {u} in einer Liste.",
    "Write a riddle whose answer is {t}, then explain {u} plainly.",
    "Write an FAQ with three questions about {t} and two about {u}.",
    "What would you tell a friend who says {t} is boring? And {u}?",
    "Explain how {t} works, then how {u} works, in plain words and without jargon.",
]

PYTHON_TEMPLATES_11 = [
    "Write a JavaScript function that {t}, then translate it to Python; add a Python function that {u}.",
    "Write a Python command-line tool with argparse: one subcommand {t}, another {u}.",
    "Write a Python function that {t}; explain which error a beginner would hit writing it, then one that {u}.",
    "Write a Go function that {t} and a Python function that {u}, each with a short comment.",
    "Write a Python function that {t} and a pytest test for it; then a function that {u} with a docstring.",
    "Show a slow and a fast Python version of a function that {t}, then a function that {u}.",
    "Write a Python module with two functions: one {t}, one {u}; end with an if __name__ == '__main__' demo.",
    "Write a Python function that {t} using only the standard library, and a Ruby function that {u}.",
]

GENERAL_TEMPLATES_12 = [
    "Write a short dialogue between a teacher and a student about {t}, in which the student brings up {u}.",
    "Give five tips for remembering facts about {t}, then two for {u}.",
    "Explain {t} as a recipe with ingredients and steps, then {u} as a map with landmarks.",
    "Write a postcard from a trip where you learned about {t} and {u}.",
    "Rank three reasons to study {t}, then name one reason to study {u}.",
    "Write a short opinion column about {t}, ending with a remark about {u}.",
    "Tell me what {t} and {u} have in common, and one way they differ.",
    "Write a short scene for a play in which two friends argue about {t} and agree about {u}.",
    "Explain {t} in exactly five sentences, then {u} in exactly three.",
    "Spiega {t} a un bambino e {u} a un adulto.",
    "Explique {t} para um amigo e depois fale de {u}.",
    "Write a museum label for an exhibit about {t}, and one for {u}.",
    "Give a beginner's glossary of four terms about {t} and two about {u}.",
    "Write a brief lecture outline with headings on {t}, then a closing section on {u}.",
    "What would change in everyday life without {t}? Without {u}?",
]

PYTHON_TEMPLATES_12 = [
    "Write a Python function that {t} and explain its edge cases; then write one that {u}.",
    "Write a C++ function that {t} and a Python function that {u}.",
    "Write a Python function that {t} with a while loop, and a function that {u} with sorted() or min().",
    "Write a Python function that {t}, then rewrite it as a one-liner; then a function that {u}.",
    "Write a Python function that {t} and print three example calls; then a function that {u}.",
    "Write an Elixir function that {t} and a Python function that {u}.",
    "Write a Python function that {t}, with a docstring in Google style, and one that {u}.",
    "Write a Python function that {t}, and explain how to debug it if it fails; then one that {u}.",
]

GENERAL_TEMPLATES_13 = [
    "Make a mind map in text form for {t}, with one branch for {u}.",
    "Write a short letter from the future describing how {t} and {u} changed.",
    "Explain {t} by answering who, what, when, where and why; then answer what and why for {u}.",
    "Write a morning radio segment about {t} and {u}.",
    "Give me three discussion questions about {t} and one about {u}, each with a sample answer.",
    "Explain a simple experiment or activity about {t}, then one about {u}.",
    "Write a biography-style paragraph as if {t} were a person, and one for {u}.",
    "Write a tweet-length summary of {t}, then a paragraph about {u}.",
    "Explique {t} con un ejemplo de la vida diaria, y luego {u}.",
    "Erkläre die Geschichte von {t} und die Bedeutung von {u}.",
    "Compare learning about {t} from a book and from a video, and say where {u} fits.",
    "Write a short adventure story in which the hero must understand {t} to find {u}.",
    "List the pros and cons of {t}, then of {u}, as two short lists.",
    "Explain {t} and {u} to a classmate who missed the lesson.",
    "Write five true-or-false statements about {t} and {u}, with the answers explained.",
]

PYTHON_TEMPLATES_13 = [
    "Write a Python function that {t} and a C# method that {u}.",
    "Write a Python function that {t} using the itertools module where it helps, and one that {u}.",
    "Write a Python function that {t}; list three test inputs and the expected outputs; then one that {u}.",
    "Write a Zig function that {t} and a Python function that {u}.",
    "Write a Python function that {t} and explain it to a beginner line by line; then one that {u}.",
    "Write a small Python class that stores data and has a method that {t} and a method that {u}.",
    "Write a Python function that {t} with early returns, and one that {u} with a dictionary.",
    "Write a Perl function that {t} and a Python function that {u}.",
]

GENERAL_TEMPLATES_14 = [
    "Give a five-minute talk outline on {t}, and a one-minute closing on {u}.",
    "Describe {t} to an alien who has never visited Earth, then {u}.",
    "Write a short fable about {t} with a moral that involves {u}.",
    "Explain why {t} is important for young people, and how {u} connects to it.",
    "Write a step-by-step guide for a school project on {t}, with a side note on {u}.",
    "Answer in two parts: (1) what is {t}? (2) how does {u} relate to it?",
    "Write a short interview question list for an expert on {t}, and one for an expert on {u}.",
    "Explain {t} using numbers or examples, then {u} the same way.",
    "Écris une courte histoire sur {t} et {u}.",
    "Escribe una lista de consejos sobre {t} y sobre {u}.",
    "Write a review of an imaginary documentary about {t} that also covers {u}.",
    "Explain the difference between a myth and a fact about {t}, with an example about {u}.",
    "Write a short motivational message for someone studying {t} and {u}.",
    "What are the big open questions about {t}? Name one about {u}.",
    "Write a two-paragraph summary: {t} first, then {u}.",
]

PYTHON_TEMPLATES_14 = [
    "Write a Python function that {t} and a Rust function that {u}, with a comment on their differences.",
    "Write a Python function that {t}, raising ValueError on bad input, and one that {u} returning None instead.",
    "Write a Python function that {t} with collections.Counter or defaultdict where useful; then one that {u}.",
    "Write a Python function that {t} and a MATLAB function that {u}.",
    "Write a Python function that {t}, then write the same in pseudocode; then a function that {u}.",
    "Write a Python function that {t} and a Bash one-liner that {u} where possible.",
    "Write a Python function that {t}; then a wrapper function that {u} and calls it.",
    "Write a Python function that {t} and show its output on two examples; then a function that {u}.",
]
