"""Lab 3, solved: the longest cached prefix. Try the lab (labs/03_prefix.py) first."""


def match_prefix(token_ids, page_size, children):
    """The page ids of the longest cached prefix of ``token_ids``, in order (a list)."""
    pages, parent = [], None
    for i in range((len(token_ids) - 1) // page_size):       # whole pages, last token kept
        want = list(token_ids[i * page_size:(i + 1) * page_size])
        hit = [p for p, tokens in children(parent) if list(tokens) == want]
        if not hit:
            break
        pages.append(hit[0])
        parent = hit[0]
    return pages
