"""A broad chat prompt mix, made here from templates (nothing is downloaded).

Prompts are instructions, explanations and Python tasks over a few hundred topics. The split is by
*topic*: a held-out topic never appears in any training prompt, so held-out prompts are unseen
questions about unseen subjects, not paraphrases of training ones.
"""

from __future__ import annotations

import hashlib
import itertools
import random

from explorer.training.prompt_rounds import (
    GENERAL_TEMPLATES_7,
    GENERAL_TEMPLATES_8,
    GENERAL_TEMPLATES_9,
    GENERAL_TEMPLATES_10,
    GENERAL_TEMPLATES_11,
    GENERAL_TEMPLATES_12,
    GENERAL_TEMPLATES_13,
    GENERAL_TEMPLATES_14,
    PYTHON_TEMPLATES_7,
    PYTHON_TEMPLATES_8,
    PYTHON_TEMPLATES_9,
    PYTHON_TEMPLATES_10,
    PYTHON_TEMPLATES_11,
    PYTHON_TEMPLATES_12,
    PYTHON_TEMPLATES_13,
    PYTHON_TEMPLATES_14,
)

GENERAL_TOPICS = """photosynthesis|the water cycle|black holes|volcanoes|earthquakes|the moon's phases|rainbows|
tides|the seasons|gravity|magnets|electricity|static electricity|sound waves|light and colour|the human heart|
the immune system|vaccines|sleep|dreams|memory|the brain|muscles|bones|digestion|vitamins|dehydration|
honeybees|ants|octopuses|whales|dolphins|penguins|elephants|wolves|owls|butterflies|coral reefs|rainforests|
deserts|glaciers|rivers|oceans|clouds|thunderstorms|hurricanes|snow|wind energy|solar panels|batteries|
recycling|composting|climate change|air pollution|plastic waste|bicycles|trains|airplanes|rockets|
satellites|the internet|email|passwords|encryption|smartphones|GPS|cameras|printing|paper|money|banks|
interest rates|inflation|saving money|budgeting|taxes|supply and demand|the stock market|insurance|
democracy|elections|the Roman Empire|ancient Egypt|the pyramids|the printing press|the industrial revolution|
the Renaissance|the Silk Road|Vikings|castles|knights|the Olympic Games|chess|football|tennis|swimming|
running|yoga|meditation|breakfast|bread|coffee|tea|chocolate|cheese|rice|pasta|soup|salad|pizza|spices|
gardening|houseplants|tomatoes|apples|bananas|dogs|cats|horses|birds|fish tanks|libraries|museums|
maps|time zones|calendars|clocks|languages|grammar|poetry|novels|fairy tales|music|the piano|the guitar|
drums|painting|photography|film|theatre|architecture|bridges|skyscrapers|roads|cities|villages|farming|
cows|wheat|forests|mushrooms|stars|planets|Mars|Jupiter|Saturn's rings|comets|the Sun|eclipses|telescopes|
microscopes|cells|DNA|evolution|dinosaurs|fossils|rocks and minerals|diamonds|gold|iron|steel|glass|
water|ice|steam|fire|friction|levers|wheels|engines|electric cars|traffic lights|public transport|
teamwork|leadership|kindness|friendship|learning a language|studying for exams|writing an essay|
giving a presentation|job interviews|time management|habits|stress|exercise|walking|camping|hiking|
maps and compasses|first aid|cooking eggs|baking a cake|making tea|cleaning a room|moving house|
writing a letter|saying thank you|birthdays|holidays|winter|summer|autumn|spring""".replace("\n", "")

PYTHON_TASKS = """reverses a string|checks whether a number is prime|returns the factorial of n|
computes the nth Fibonacci number|counts the vowels in a string|removes duplicates from a list|
finds the largest number in a list|merges two sorted lists|checks whether a string is a palindrome|
sums the digits of an integer|converts Celsius to Fahrenheit|flattens a nested list|
counts how often each word appears in a text|returns the average of a list of numbers|
capitalizes the first letter of each word|checks whether two strings are anagrams|
finds the second largest number in a list|reads a text file and counts its lines|
returns the greatest common divisor of two numbers|sorts a list of dictionaries by a key|
splits a list into chunks of size n|returns the intersection of two lists|
validates an email address with a simple rule|converts a binary string to an integer|
generates a random password|finds all even numbers in a list|returns the median of a list|
removes punctuation from a string|checks whether a year is a leap year|rotates a list by k positions|
transposes a matrix|computes the dot product of two vectors|returns the length of the longest word|
counts the uppercase letters in a string|converts a list of strings to integers|
returns the squares of the numbers from 1 to n|finds the index of an item in a list|
implements binary search|implements bubble sort|computes the power set of a list|
returns a dictionary that maps each character to its count|checks whether a list is sorted|
parses a date string like 2024-01-31|formats a number with thousands separators|
builds a simple stack class|builds a simple queue class|computes compound interest|
returns the n most common words in a text|checks balanced parentheses|
converts a dictionary to a JSON string|reads a CSV file into a list of rows|
returns the difference between two dates in days|merges two dictionaries|
computes the area of a circle|returns the prime factors of a number|
finds the longest common prefix of a list of strings|counts the words in a sentence|
replaces spaces with underscores|truncates a string to n characters|returns the last n items of a list|
checks whether a number is a perfect square|converts seconds to hours, minutes and seconds|
computes the running total of a list|zips two lists into a dictionary|
filters out empty strings from a list|returns the unique words of a text in order|
shuffles a list in place|picks a random element from a list|
computes the Euclidean distance between two points|checks whether a string contains only digits""".replace("\n", "")

GENERAL_TEMPLATES = [
    "Explain {t} in simple terms.",
    "Tell me about {t}.",
    "Give me three interesting facts about {t}.",
    "Write a short paragraph about {t}.",
    "Why should we care about {t}?",
    "How would you explain {t} to a ten-year-old?",
    "Write a few tips about {t}.",
    "Summarize what people should know about {t}.",
    "Write a short poem about {t}.",
    "What are common misconceptions about {t}?",
]

PYTHON_TEMPLATES = [
    "Write a Python function that {t}.",
    "How do I write a function in Python that {t}?",
    "Show me Python code that {t}, and explain it briefly.",
    "Write a short Python program that {t}. Add a docstring.",
    "Implement a Python function that {t}, with a short example of how to call it.",
    "I need Python code that {t}. Keep it simple.",
    "Write a Python function that {t}. Use type hints.",
    "Can you write Python that {t}?",
]


# A second round of wordings over the same topics (the data stage's prompts after the first round's ran out).
GENERAL_TEMPLATES_2 = [
    "What is {t}, and how does it work?",
    "Describe {t} in two or three sentences.",
    "List five key points about {t}.",
    "Write a short story that involves {t}.",
    "What is the history of {t}?",
    "Compare {t} with something similar, and explain the difference.",
    "What questions do children often ask about {t}? Answer two of them.",
    "Give a beginner's guide to {t}.",
    "Write a haiku about {t}, then explain it.",
    "What would the world be like without {t}?",
]

PYTHON_TEMPLATES_2 = [
    "Write a Python function that {t}, and add two unit tests.",
    "Explain step by step how to write Python code that {t}.",
    "Write a Python one-liner or a short function that {t}.",
    "Write a Python function that {t}. Handle empty or invalid input.",
    "Write a Python class with a method that {t}.",
    "What is the most readable way in Python to write a function that {t}?",
    "Write a Python function that {t}, and state its time complexity.",
    "Write a Python script that {t} and prints the result for a sample input.",
]

# A third round: step-by-step and list answers, short dialogues and quizzes, three other languages, and code in
# other languages than Python (the same topics and tasks, so the held-out split stays a split by topic).
GENERAL_TEMPLATES_3 = [
    "Explain step by step how {t} works.",
    "Make a numbered list of the most important things to know about {t}.",
    "Write a short dialogue between a student and a teacher about {t}.",
    "Write three quiz questions about {t}, with their answers.",
    "Explique {t} en termes simples, en français.",
    "Explica {t} en pocas palabras, en español.",
    "Erkläre {t} in einfachen Worten auf Deutsch.",
    "What are the pros and cons of {t}?",
    "Give an everyday example that shows {t}.",
    "Write a short blog post introduction about {t}.",
    "Answer in one sentence: what is {t}?",
    "I am writing a school report on {t}. What should I include?",
]

PYTHON_TEMPLATES_3 = [
    "Write a JavaScript function that {t}.",
    "Write a C function that {t}.",
    "Write a Java method that {t}.",
    "Write a TypeScript function that {t}, with types.",
    "Write a Rust function that {t}.",
    "Write pseudocode for a function that {t}, then the Python version.",
    "Here is a task: a function that {t}. Write it in Python and explain each line.",
    "Write a Python function that {t}, and show its output on two examples.",
]

# A fourth round, for the data made on vLLM: more kinds of answer over the same topics.
GENERAL_TEMPLATES_4 = [
    "Explain {t} to a five-year-old.",
    "Explain {t} to a university student.",
    "Write a limerick about {t}.",
    "Summarize {t} in exactly three bullet points.",
    "Write an FAQ with three questions and answers about {t}.",
    "How is {t} part of everyday life?",
    "Describe {t} using an analogy.",
    "Give a short timeline of important moments in the story of {t}.",
    "How would a scientist explain {t}?",
    "Define five words a learner should know when studying {t}.",
    "Write a persuasive paragraph about why {t} matters.",
    "What jobs or careers are connected to {t}?",
    "Outline a 30-minute lesson plan on {t}.",
    "Write a short news report about a new discovery related to {t}.",
    "What are the main parts of {t}, and what does each do?",
    "Write an email to a friend about {t}.",
    "Write a riddle whose answer is {t}, then give the answer.",
    "What mistakes do people often make about {t}, and how can they avoid them?",
    "Describe {t} from the point of view of a curious alien visiting Earth.",
    "Make a Markdown table with four facts about {t}.",
    "Write a JSON object that describes {t} with a few fields.",
    "Spiega {t} in parole semplici, in italiano.",
    "Explique {t} em poucas palavras, em português.",
    "What is one surprising thing about {t}? Explain why it is surprising.",
    "Write a short speech for a school assembly about {t}.",
    "If you could ask an expert one question about {t}, what would it be, and what might they answer?",
]

PYTHON_TEMPLATES_4 = [
    "Write a Go function that {t}.",
    "Write a C++ function that {t}.",
    "Write a Ruby method that {t}.",
    "Write a Kotlin function that {t}.",
    "Write a C# method that {t}.",
    "Write a Python function that {t}, with a docstring and type hints, and no imports.",
    "A beginner wrote a Python function that {t}, but it crashes on empty input. Show a fixed version.",
    "Write a recursive Python function that {t}, if recursion fits; otherwise explain why not and use a loop.",
    "Describe in plain English an algorithm that {t}, then write it in Python.",
    "Write a Python function that {t}, and a pytest test for it.",
    "Write a Python function that {t}. Then rewrite it in a more compact style.",
    "Write a Python function that {t}, and explain its edge cases.",
    "Write a Python command-line script that {t}, reading its input from sys.argv.",
    "Write a Python function that {t}, with comments on every line.",
]

# A fifth round: two topics per prompt ({t} and a partner {u} from the same split), so the mix stays a split
# by topic while the number of distinct prompts grows with the pairs.
GENERAL_TEMPLATES_5 = [
    "Compare {t} and {u}.",
    "How are {t} and {u} connected?",
    "Write a short story that involves {t} and {u}.",
    "Explain {t} first, then {u}, in simple terms.",
    "What do {t} and {u} have in common, and how do they differ?",
    "Write a short poem that mentions {t} and {u}.",
    "Which is easier to explain to a child, {t} or {u}? Explain both.",
    "Give two facts about {t} and two facts about {u}.",
    "Write a dialogue in which one person asks about {t} and the other about {u}.",
    "Plan a school project that combines {t} and {u}.",
    "Write a quiz with one question about {t} and one about {u}, with answers.",
    "Tell me about {t}. Then tell me about {u}.",
]

PYTHON_TEMPLATES_5 = [
    "Write a Python module with two functions: one that {t}, and one that {u}.",
    "Write a Python function that {t}, and another that {u}. Show how to call both.",
    "Which is harder to write in Python: a function that {t}, or one that {u}? Write both.",
    "Write Python code that {t}, then a second function that {u}, with a docstring each.",
    "Write a JavaScript function that {t} and a Python function that {u}.",
    "Write a small Python class whose methods do two things: one {t}, and the other {u}.",
]

# A sixth round: two topics again, each template with partners no earlier template used (``chat_prompts``).
GENERAL_TEMPLATES_6 = [
    "Write a short letter from {t} to {u}.",
    "Explain how {t} could help someone learn about {u}.",
    "Write a short debate: which matters more, {t} or {u}?",
    "Make a Markdown table that compares {t} and {u}.",
    "Write one riddle about {t} and one about {u}, with the answers.",
    "Describe a museum with one room about {t} and one about {u}.",
    "What can {t} teach us about {u}?",
    "Write a haiku about {t} and a haiku about {u}.",
    "Give a beginner's guide to {t}, then to {u}, in short bullet points.",
    "Write three quiz questions that mix {t} and {u}, with answers.",
    "Explain {t} and {u} to a ten-year-old.",
    "Write a short blog post that connects {t} and {u}.",
    "I have ten minutes to learn about {t} and {u}. What should I read first, and why?",
    "Write a short conversation between two friends, one who loves {t} and one who loves {u}.",
]

PYTHON_TEMPLATES_6 = [
    "Write two Python functions, one that {t} and one that {u}, and a main block that calls both.",
    "Write a Go function that {t} and a Python function that {u}.",
    "Write pytest tests for a function that {t} and for a function that {u}.",
    "Explain the time complexity of a function that {t} and of a function that {u}, with code.",
    "Write a C function that {t} and a Rust function that {u}.",
    "Write a Python script with a menu: option 1 {t}, option 2 {u}.",
    "Write a TypeScript function that {t} and a Java method that {u}.",
]

ROUNDS = [(GENERAL_TEMPLATES, PYTHON_TEMPLATES), (GENERAL_TEMPLATES_2, PYTHON_TEMPLATES_2),
          (GENERAL_TEMPLATES_3, PYTHON_TEMPLATES_3), (GENERAL_TEMPLATES_4, PYTHON_TEMPLATES_4),
          (GENERAL_TEMPLATES_5, PYTHON_TEMPLATES_5), (GENERAL_TEMPLATES_6, PYTHON_TEMPLATES_6),
          (GENERAL_TEMPLATES_7, PYTHON_TEMPLATES_7),
          (GENERAL_TEMPLATES_8, PYTHON_TEMPLATES_8),
          (GENERAL_TEMPLATES_9, PYTHON_TEMPLATES_9), (GENERAL_TEMPLATES_10, PYTHON_TEMPLATES_10),
          (GENERAL_TEMPLATES_11, PYTHON_TEMPLATES_11), (GENERAL_TEMPLATES_12, PYTHON_TEMPLATES_12),
          (GENERAL_TEMPLATES_13, PYTHON_TEMPLATES_13), (GENERAL_TEMPLATES_14, PYTHON_TEMPLATES_14)]


def _topics(blob: str) -> list[str]:
    return [t.strip() for t in blob.split("|") if t.strip()]


def is_heldout_topic(topic: str, every: int = 8) -> bool:
    """Deterministic: one topic in ``every`` (by sha1 of its text) is held out."""
    return int(hashlib.sha1(topic.encode()).hexdigest(), 16) % every == 0


def chat_prompts(split: str = "train", seed: int = 0, rounds: int = 1) -> list[dict]:
    """All prompts of a split, shuffled with a fixed seed: ``[{"id", "prompt", "kind"}]``.

    ``rounds`` > 1 appends the prompts of the later wordings (``ROUNDS``), each round shuffled on its own, so
    the first round's order, and so every shard already made from it, stays as it was.
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', not {split!r}")
    if not 1 <= rounds <= len(ROUNDS):
        raise ValueError(f"rounds must be 1..{len(ROUNDS)}, not {rounds}")
    out = []
    for r, (general, python) in enumerate(ROUNDS[:rounds]):
        this = []
        for kind, blob, templates in (("general", GENERAL_TOPICS, general), ("python", PYTHON_TASKS, python)):
            topics = [t for t in _topics(blob) if is_heldout_topic(t) == (split == "heldout")]
            # two-topic templates of earlier rounds: this round's partners start after theirs
            earlier = sum("{u}" in t for g, p in ROUNDS[:r] for t in (g if kind == "general" else p))
            for (k, topic), (i, template) in itertools.product(enumerate(topics), enumerate(templates)):
                tag = f"{i}" if r == 0 else f"r{r + 1}.{i}"
                fill = {"t": topic}
                if "{u}" in template:  # a partner from the same split, never the topic itself
                    fill["u"] = topics[(k + 1 + (7 * (earlier + i)) % max(len(topics) - 1, 1)) % len(topics)]
                    tag += f":{fill['u']}"
                this.append({"id": f"{kind}:{topic}:{tag}", "prompt": template.format(**fill), "kind": kind})
        random.Random(seed if r == 0 else seed * 1_000 + r).shuffle(this)
        out += this
    return out
