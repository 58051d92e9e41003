"""The agent ↔ real-model worker messages (realmodel/worker_wire.py): JSON with bytes and arrays, no pickle."""

from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16

from kvtransit.realmodel.errors import RealModelError
from kvtransit.realmodel.worker_wire import pack, unpack


def test_a_score_request_comes_back_with_its_chunks_bytes_and_the_rows_bit_for_bit():
    rows = np.arange(6 * 5 * 4, dtype=np.float32).reshape(6, 5, 4).astype(bfloat16)
    chunk = (3, 0, b"", rows.tobytes(), (6, 5, 4))
    message = ["score", [{"text": "gpl-3", "offset": 0, "context": 512, "continuation": 32}, [chunk], True]]
    name, (window, chunks, model) = unpack(pack(message))
    assert (name, window["text"], model) == ("score", "gpl-3", True)
    assert chunks == [[3, 0, b"", rows.tobytes(), [6, 5, 4]]]  # tuples come back as lists
    answer = unpack(pack(["ok", [rows, {"k_err2": np.float64(0.5)}]]))
    assert answer[1][0].dtype == bfloat16 and answer[1][0].tobytes() == rows.tobytes()
    assert answer[1][1] == {"k_err2": 0.5}


def test_an_array_of_a_dtype_it_does_not_carry_is_refused_by_name():
    with pytest.raises(RealModelError, match="arrays of complex128 are not carried"):
        pack([np.zeros(2, dtype=np.complex128)])


def test_bytes_past_the_last_buffer_are_refused():
    with pytest.raises(RealModelError, match="3 bytes past"):
        unpack(pack({"a": b"xy"}) + b"abc")
