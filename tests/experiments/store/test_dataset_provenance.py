"""The store records the data set's provenance with the study (python_source's Python version
and corpus digest) and refuses results on data with another content digest."""

import json
import sqlite3

import pytest

from experiments.store.database import StoreContentError, open_store
from experiments.store.schema import StudyInfo

from ..synthetic import spec_text
from experiments.spec.study import loads


def info(**provenance):
    spec = loads(spec_text())
    return StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json(),
                     json.dumps(provenance, sort_keys=True))


def test_provenance_is_recorded_and_other_data_refused(tmp_path):
    first = info(python_version="3.11.7", corpus_digest="aaaa", files=734)
    with open_store(tmp_path, first):
        pass
    row = sqlite3.connect(tmp_path / "results.sqlite").execute(
        "SELECT python_version, dataset_json FROM study").fetchone()
    assert json.loads(row[1]) == {"python_version": "3.11.7", "corpus_digest": "aaaa",
                                  "files": 734}
    with open_store(tmp_path, first):       # the same data: accepted
        pass
    with open_store(tmp_path, info(python_version="3.11.7", corpus_digest="aaaa", files=1)):
        pass                                 # only the content digest decides
    with pytest.raises(StoreContentError, match=r"holds results on other data: its data set's "
                                                r"corpus_digest is aaaa, this one's bbbb \(written "
                                                r"with Python 3.11.7, this is 3.12.1\)"):
        with open_store(tmp_path, info(python_version="3.12.1", corpus_digest="bbbb")):
            pass


def test_a_store_without_provenance_accepts_any(tmp_path):
    spec = loads(spec_text())
    with open_store(tmp_path, StudyInfo(spec.name, spec.toml, spec.hash, spec.to_json())):
        pass
    with open_store(tmp_path, info(corpus_digest="cccc")):
        pass
