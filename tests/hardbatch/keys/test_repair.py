"""hardbatch.keys.repair: a clashing item swaps with the nearest item of the nearest batch, and
stuck swaps fall back to a construction (single keys) or a greedy partition (key sets)."""

import numpy as np
from keys_support import clashes
from sampler_support import conflicts

from hardbatch.keys.encode import encode_keys
from hardbatch.keys.repair import greedy_partition, separate_keys


def test_a_clash_swaps_with_the_nearest_item_of_the_nearest_batch():
    keys = ["a", "a", "x", "y", "z", "w"]  # batches [0 1] [2 3] [4 5]: 1 clashes with 0
    enc = encode_keys(keys, 6)
    order = np.arange(6)
    assert separate_keys(order, 6, 2, enc).tolist() == [0, 2, 1, 3, 4, 5]
    # the nearest batch holds the key too: the next one
    keys = ["a", "a", "a", "y", "z", "w"]
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)).tolist() == [0, 4, 2, 3, 1, 5]
    # backwards when the clash is in the last batch, from the end nearest to it
    keys = ["x", "y", "z", "w", "a", "a"]
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)).tolist() == [0, 1, 2, 5, 4, 3]
    # no key shared within a batch: the same order back
    keys = ["a", "x", "a", "y", "a", "z"]
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)) is not None
    assert separate_keys(order, 6, 2, encode_keys(keys, 6)).tolist() == order.tolist()


def test_stuck_swaps_fall_back_to_a_construction():
    # batches of 3 over [5 1 2 | 6 4 0 | 3]: no single swap separates key 1 (items 1, 2, 5)
    keys = [3, 1, 1, 2, 3, 1, 2]
    out = separate_keys(np.array([5, 1, 2, 6, 4, 0, 3]), 7, 3, encode_keys(keys, 7))
    batches = [out[:3].tolist(), out[3:6].tolist(), out[6:].tolist()]
    assert sorted(out.tolist()) == list(range(7)) and clashes(batches, keys) == 0


def test_stuck_swaps_fall_back_to_a_greedy_partition():
    # a star: item 0 conflicts with 1..5 (key "hub" held by 0 and the key "s{i}" pairs)
    sets = [frozenset({"x", "y"}), frozenset({"x"}), frozenset({"y"}), frozenset({"z"}),
            frozenset({"z", "w"}), frozenset({"w"})]
    keys = encode_keys(sets, 6)
    out = greedy_partition(np.arange(6), 6, 2, keys.ptr, keys.idx)
    assert sorted(out.tolist()) == list(range(6)) and conflicts(out.reshape(3, 2), sets) == 0
    order = separate_keys(np.array([0, 1, 2, 3, 4, 5]), 6, 3, keys)
    assert conflicts(order.reshape(2, 3), sets) == 0
