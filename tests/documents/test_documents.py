"""The documents' printed values: complete, well-formed, cited, and never read from disk."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from attention_ref import documents as d

ROOT = Path(__file__).resolve().parents[2]


def test_five_documents_are_cited_by_file_name():
    assert len(d.DOCUMENTS) == 5
    for name in d.DOCUMENTS:
        assert re.fullmatch(r"00[0-4]_[0-9a-f]{16}\.txt", name), name


@pytest.mark.parametrize("table", [d.SINGLE_TOKEN, d.TWO_HEAD, d.HULL, d.PARAMS, d.COST, d.HEAD_DIM])
def test_every_citation_names_a_document_and_a_section(table):
    cites = [v for k, v in table.items() if k.startswith("cite")]
    assert cites, "each table cites where its values are printed"
    for c in cites:
        assert isinstance(c, d.Citation) and c.document in d.DOCUMENTS and c.section


def test_verbal_claims_are_cited():
    for cite, text in d.PRINTED_VERBAL.values():
        assert cite.document in d.DOCUMENTS and len(text) > 10


def test_two_head_example_shapes_as_printed():
    t = d.TWO_HEAD
    for name in ("W_Q", "W_K", "W_V"):
        blocks = np.array(t[name])
        assert blocks.shape == (t["h"], t["d_model"], t["d_k"])  # W_i in R^{d_model x d_k}
    for name in ("printed_Q", "printed_K", "printed_V", "printed_head"):
        assert np.array(t[name]).shape == (t["h"], t["d_k"])
    assert np.array(t["W_O_as_printed"]).shape == (3, 4)  # typeset 3 x 4 ...
    assert t["W_O_declared_shape"] == (t["h"] * t["d_v"], t["d_model"])  # ... declared 4 x 3
    # the printed concatenation is the printed heads side by side (the document is consistent there)
    assert t["printed_concat"] == t["printed_head"][0] + t["printed_head"][1]


def test_nothing_reads_the_shared_documents():
    """The project stands on its own: no source file opens ../shared."""
    pattern = re.compile(r"shared[/\\]documents|\.\./shared")
    seen = set()
    for path in list(ROOT.rglob("attention_ref/**/*.py")) + list(ROOT.glob("examples/*.py")) \
            + list(ROOT.glob("tests/**/*.py")) + list(ROOT.glob("notebooks/*.ipynb")):
        if path.name == "test_documents.py":
            continue
        seen.add(path.relative_to(ROOT).parts[0] + "/" + "/".join(path.relative_to(ROOT).parts[1:-1]))
        assert not pattern.search(path.read_text(encoding="utf-8")), path
    assert {"attention_ref/core", "attention_ref/documents/claims", "tests/core"} <= seen  # it recursed
