"""Image sizes as COCO val has them: the (height, width) frequency table of an annotation file, and
a sample of any number of sizes with those frequencies.

Run as a script it writes the table module from an annotation file (LABEL names it in the module):
    python tools/benchmark_lib/image_sizes.py ANNOTATION_JSON LABEL > tools/benchmark_lib/coco_val_sizes.py
"""
import collections
import json
import os
import sys

import numpy as np


ROW_ENTRIES = 6  # entries per line of the written table (COCO val2017 has 603 sizes)


def size_table(annotation_file):
    """[(height, width, images)] of a COCO-format annotation file, most frequent first (ties by size)."""
    with open(annotation_file) as f:
        images = json.load(f)['images']
    counts = collections.Counter((im['height'], im['width']) for im in images)
    return sorted(((h, w, n) for (h, w), n in counts.items()), key=lambda s: (-s[2], s[0], s[1]))


def sample_sizes(table, num, seed=0):
    """num (height, width) pairs whose frequencies follow the table's: the sizes at the quantiles
    (k + 0.5) / num of the table's cumulative frequency, in a shuffled order (a dataset meets its
    sizes in no particular order)."""
    counts = np.array([n for _, _, n in table], dtype=np.float64)
    cumulative = np.cumsum(counts) / counts.sum()
    picks = np.searchsorted(cumulative, (np.arange(num) + 0.5) / num)
    order = np.random.RandomState(seed).permutation(num)
    return [tuple(table[i][:2]) for i in picks[order]]


def table_module(annotation_file, label):
    """The text of coco_val_sizes.py for this annotation file, called `label` there."""
    table = size_table(annotation_file)
    command = 'python tools/benchmark_lib/image_sizes.py {} {!r} > tools/benchmark_lib/coco_val_sizes.py'.format(
        os.path.basename(annotation_file), label)
    lines = ['"""(height, width, images) of the {} images of {}, most frequent first.'.format(
                 sum(n for _, _, n in table), label),
             '', 'Written by:', '    ' + command, '"""', 'SOURCE = {!r}'.format(label), 'SIZES = [']
    entries = ['({}, {}, {}),'.format(*row) for row in table]
    lines += ['    ' + ' '.join(entries[i:i + ROW_ENTRIES]) for i in range(0, len(entries), ROW_ENTRIES)]
    return '\n'.join(lines + [']', ''])


if __name__ == '__main__':
    sys.stdout.write(table_module(sys.argv[1], sys.argv[2]))
