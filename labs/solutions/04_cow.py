"""Lab 4, solved: copy-on-write. Try the lab (labs/04_cow.py) first."""


def pages_to_copy(block_table, ref_counts, start, n, page_size):
    """Indices i of ``block_table`` to copy before tokens ``start .. start + n - 1`` are written."""
    first = start // page_size                       # the page token `start` lands in
    need = -(-(start + n) // page_size)              # pages the tokens need in all
    return [i for i in range(first, min(len(block_table), need)) if ref_counts[i] > 1]


def copy_on_write(block_table, i, dst, copy_page, drop):
    """Give the sequence its own copy of its shared page ``block_table[i]`` in page ``dst``."""
    src = block_table[i]
    copy_page(src, dst)          # the K/V first, while the shared page is still held
    block_table[i] = dst         # this sequence reads and writes its copy from now on
    drop(src)                    # its other holders keep theirs
