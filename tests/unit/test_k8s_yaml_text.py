"""The manifests' YAML writer: whatever it writes, a YAML parser reads back as the very value it was given."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtransit.harness.deploy.k8s.yaml_text import dump, dump_all

# Strings YAML 1.1 (PyYAML, go-yaml v2) would read as something else if written plain.
TRICKY = ["yes", "No", "on", "OFF", "y", "null", "~", "true", "1", "-1", "1.5", "1e3", "0x1F", "0o17", "1_000",
          "12:30", "2024-01-01", ".inf", "-.NaN", "", " lead", "trail ", "a: b", "a #b", "x:", "- item", "[x]",
          "{x}", "'q'", '"q"', "*alias", "&anchor", "!tag", "%dir", "@at", "`tick`", "|", ">", "=", "<<",
          "$(KVTRANSIT_SCENARIO_model)", "0.0.0.0:9000", "decode:9000", "http://x:9090/y", "--model",
          "line\nline", "ends\n", "two\n\n", "\n", "tab\tin", "  indented\nblock", "uni é ☃", "\u2028", "nul\x00"]


@pytest.mark.parametrize("text", TRICKY)
def test_a_string_reads_back_as_the_same_string(text):
    document = {"key": text, "list": [text], "nested": {"deeper": [{"k": text}]}}
    assert yaml.safe_load(dump(document)) == document


def test_numbers_booleans_and_empty_containers_keep_their_types():
    document = {"int": 9000, "neg": -3, "float": 1e-05, "big": 1e20, "pi": 3.14159, "t": True, "f": False,
                "none": None, "empty_map": {}, "empty_list": [], "zero": 0.0}
    assert yaml.safe_load(dump(document)) == document


def test_multi_line_text_is_written_as_a_literal_block():
    text = dump({"script": "import sys\nprint(sys.argv)\n"})
    assert text == "script: |\n  import sys\n  print(sys.argv)\n"


def test_documents_are_separated_and_each_reads_back():
    docs = [{"a": 1}, {"b": ["x", {"c": "d"}]}]
    assert list(yaml.safe_load_all(dump_all(docs))) == docs


def test_a_value_yaml_cannot_hold_is_refused():
    with pytest.raises(ValueError, match="finite"):
        dump({"x": float("nan")})
    with pytest.raises(TypeError, match="keys"):
        dump({1: "x"})


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**12, 10**12),
                     st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=30))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=12), _values, max_size=5))
def test_any_plain_data_round_trips(document):
    assert yaml.safe_load(dump(document)) == document
