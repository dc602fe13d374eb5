"""The chats of ``benchmarks/spec_decode.py``: four input-grounded kinds and open questions.

- input-grounded: *copy* (repeat a paragraph), *correct* (fix its typos),
  *extract* (list the names and dates of a passage), *edit* (rename a
  variable in a function): most of the answer is in the prompt, which is
  what prompt lookup drafts from;
- *open*: questions with no text to copy.
"""

from __future__ import annotations

PARAGRAPHS = [
    "The city council met on Tuesday evening to discuss the new bicycle lanes on Main "
    "Street. Several shop owners worried that removing parking spaces would hurt their "
    "business, while cyclists argued that safer lanes would bring more customers to the "
    "town centre. After two hours of debate, the council agreed to run a six-month trial "
    "and to count visitors before and after the change.",
    "Photosynthesis is the process by which green plants turn light into chemical energy. "
    "Inside the leaves, chlorophyll absorbs sunlight and uses it to split water into "
    "oxygen and hydrogen. The hydrogen is then combined with carbon dioxide from the air "
    "to build sugars, which the plant stores or burns for energy. The oxygen is released "
    "into the atmosphere, where animals breathe it.",
    "Our team moved the weekly planning meeting from Monday to Wednesday so that the "
    "support engineers could join after their morning shift. Please bring a short list "
    "of the tasks you finished last week and the ones you expect to finish this week. "
    "If you cannot attend, send your list to the project lead before noon.",
]
TYPOS = [("discuss", "discus"), ("business", "buisness"), ("customers", "custmers"),
         ("agreed", "agred"), ("chemical", "chemcal"), ("atmosphere", "atmosfere"),
         ("absorbs", "absorbes"), ("weekly", "weekely"), ("engineers", "enginers"),
         ("finished", "finnished"), ("project", "projekt")]
PASSAGES = [
    "On 14 March 1879, Albert Einstein was born in Ulm. He later studied in Zurich, where "
    "he met Mileva Maric, whom he married on 6 January 1903. In 1905, while working at "
    "the patent office in Bern with his friend Michele Besso, he published four papers. "
    "Max Planck was among the first to recognise their importance, and in 1921 Einstein "
    "received the Nobel Prize in Physics.",
    "Ada Lovelace was born in London on 10 December 1815, the daughter of the poet Lord "
    "Byron. In 1833 she met Charles Babbage, who showed her his Difference Engine. In "
    "1843 she translated an article by Luigi Menabrea about the Analytical Engine and "
    "added long notes of her own. She died on 27 November 1852, and Alan Turing later "
    "discussed her notes in 1950.",
    "The expedition left Cape Town on 2 February 1911 under the command of Captain "
    "Robert Scott. Edward Wilson and Henry Bowers joined the polar party, and on "
    "17 January 1912 they reached the South Pole, only to find that Roald Amundsen had "
    "arrived on 14 December 1911. Lawrence Oates walked out into the storm on 17 March "
    "1912.",
]
FUNCTIONS = [
    ("tmp", "total", "def average_price(items):\n"
     "    tmp = 0\n"
     "    count = 0\n"
     "    for item in items:\n"
     "        if item.price is None:\n"
     "            continue\n"
     "        tmp += item.price\n"
     "        count += 1\n"
     "    if count == 0:\n"
     "        return 0.0\n"
     "    return tmp / count\n"),
    ("lst", "names", "def unique_sorted(words):\n"
     "    lst = []\n"
     "    for word in words:\n"
     "        word = word.strip().lower()\n"
     "        if word and word not in lst:\n"
     "            lst.append(word)\n"
     "    lst.sort()\n"
     "    return lst\n"),
    ("d", "counts", "def count_letters(text):\n"
     "    d = {}\n"
     "    for ch in text:\n"
     "        if not ch.isalpha():\n"
     "            continue\n"
     "        ch = ch.lower()\n"
     "        d[ch] = d.get(ch, 0) + 1\n"
     "    return sorted(d.items(), key=lambda kv: -kv[1])\n"),
]
OPEN = [
    "Why is the sky blue? Explain it to a curious ten-year-old.",
    "Give me three tips for learning to cook at home.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
]


def _typos(text: str) -> str:
    for right, wrong in TYPOS:
        text = text.replace(right, wrong)
    return text


def _user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def prompts() -> dict[str, list[list[dict]]]:
    """Category -> conversations (three each, in the order they are run)."""
    return {
        "copy": [_user("Repeat the following paragraph exactly, word for word:\n\n" + p)
                 for p in PARAGRAPHS],
        "correct": [_user("Fix the spelling mistakes in this paragraph and write out the "
                          "whole corrected paragraph:\n\n" + _typos(p)) for p in PARAGRAPHS],
        "extract": [_user("List every person and every date mentioned in this passage, "
                          "one per line:\n\n" + p) for p in PASSAGES],
        "edit": [_user(f"Rename the variable `{old}` to `{new}` in this Python function and "
                       f"return the whole function:\n\n```python\n{code}```")
                 for old, new, code in FUNCTIONS],
        "open": [_user(q) for q in OPEN],
    }


GROUNDED = ("copy", "correct", "extract", "edit")
