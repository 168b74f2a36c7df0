"""Rounds 7-10 of the prompt wordings (``prompts.ROUNDS``), added in the ninth session: two topics per prompt
({t} and a partner {u} from the same split), each template with partners no earlier template used."""

# A seventh round (ninth session): two topics, with kinds of answer the earlier rounds lack (French, German and
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

# An eighth round (ninth session): follow-up questions written as one turn, definitions, pros and cons,
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

# Rounds nine and ten (ninth session): more two-topic kinds (explain-like-a-teacher, timelines, checklists,
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
