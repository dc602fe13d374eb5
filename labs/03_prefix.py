"""Lab 3: the longest cached prefix.

Run it:  python -m paged_np lab prefix --solution labs/03_prefix.py

When a prompt arrives, the cache looks for pages that already hold the K/V of
its beginning (a system prompt, an earlier turn of the chat), so those tokens
need no computing. Cached pages form a tree: a page's parent is the page that
held the tokens just before it. ``children(page)`` lists the cached pages that
follow ``page`` (``children(None)``: the pages that start a prompt), each as
``(page_id, tokens)``.

You write the walk: from the root, one whole page at a time, take the child
whose tokens are exactly the prompt's next page; stop at the first page that
does not match. Two rules:

- whole pages only: a cached page whose tokens merely *begin* like the rest of
  the prompt holds K/V of other tokens;
- at most ``len(token_ids) - 1`` tokens: the prompt's last token is always
  computed, because its logits give the first new token.

The lab plugs your walk into the engine's prefix cache and serves SmolLM2 (whose
chats share a system prompt) and a toy workload.
"""


def match_prefix(token_ids, page_size, children):
    """The page ids of the longest cached prefix of ``token_ids``, in order (a list).

    token_ids: a list of ints; page_size: tokens per page; children(page) ->
    [(page_id, tokens), ...], the cached pages that follow ``page`` (None: the root).
    """
    raise NotImplementedError        # your code here (about eight lines)
