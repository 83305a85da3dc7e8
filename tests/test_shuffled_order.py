"""The suite's shuffled order (tests/shuffled_order.py) against the properties it promises, on stand-in items."""
import dataclasses

import shuffled_order


@dataclasses.dataclass
class Item:
    nodeid: str
    cls: object = None
    slow: bool = False

    def get_closest_marker(self, name):
        return "slow" if name == "slow" and self.slow else None


class A:
    pass


class B:
    pass


def _items():
    items = [Item(f"tests/f{f}.py::t{t}") for f in range(6) for t in range(5)]
    items += [Item(f"tests/c.py::{c.__name__}::t{t}", cls=c) for c in (A, B) for t in range(4)]
    items += [Item("tests/c.py::t_plain")]
    items += [Item(f"tests/slow{f}.py::t{t}", slow=True) for f in range(3) for t in range(2)]
    return items


def _runs(order, key):
    """The keys of ``order`` with consecutive repeats removed."""
    runs = []
    for item in order:
        if not runs or runs[-1] != key(item):
            runs.append(key(item))
    return runs


def test_a_seed_gives_one_order_and_another_seed_another():
    items = _items()
    first = shuffled_order.shuffled(items, 7)
    assert first == shuffled_order.shuffled(list(items), 7)
    assert sorted(i.nodeid for i in first) == sorted(i.nodeid for i in items)
    orders = {tuple(i.nodeid for i in shuffled_order.shuffled(items, seed)) for seed in range(20)}
    assert len(orders) == 20
    files = {tuple(_runs(shuffled_order.shuffled(items, seed), lambda i: i.nodeid.split("::")[0]))
             for seed in range(20)}
    assert len(files) > 10  # the files' order changes too, not only the tests' within a file


def test_files_and_classes_stay_together_and_the_slow_files_go_first():
    for seed in range(20):
        order = shuffled_order.shuffled(_items(), seed)
        files = _runs(order, lambda i: i.nodeid.split("::")[0])
        assert len(files) == len(set(files)) == 10  # each file's tests in one run
        in_c = [i for i in order if i.nodeid.startswith("tests/c.py")]
        classes = _runs(in_c, lambda i: i.cls)
        assert len(classes) == len(set(classes)) == 3
        assert all(i.slow for i in order[:6]) and not any(i.slow for i in order[6:])


def test_without_a_seed_the_order_is_kept_but_the_slow_files_go_first():
    items = _items()
    order = shuffled_order.shuffled(items, None)
    assert order == [i for i in items if i.slow] + [i for i in items if not i.slow]
