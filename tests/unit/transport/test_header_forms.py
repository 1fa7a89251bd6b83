"""Prebuilt data headers (transport/wire.py, HeaderForms): every header a plan's forms make
decodes to exactly what encode_header's does, for any sequence, index and send time, and the
forms kept stay bounded."""

import time

import pytest

from collectives.transport.wire import (
    DATA,
    P2P_DATA,
    PROBE,
    Descriptor,
    HeaderForms,
    decode_header,
    encode_header,
)

DESC = Descriptor("all_reduce", 1, "<f4", "sum", "direct", None)
CASES = [
    (DATA, 0, 0, 0, 0, "", 0, 0),
    (DATA, 3, 100, 1, 0, "exchange", 0, 1),
    (DATA, 2**31, 2**40, 127, 2**20, "reduce-scatter", 17, 300),
    (P2P_DATA, 5, 9, 3, 4, "x" * 40, -1, -7),
    (PROBE, 1, 2, 3, 0, "p", 0, 0),
]


@pytest.mark.parametrize("desc", [DESC, None])
@pytest.mark.parametrize("case", CASES)
def test_a_prebuilt_header_decodes_as_encode_headers(case, desc):
    forms = HeaderForms(desc)
    for sent_at in (0.0, time.time(), 1e-300):
        want = decode_header(encode_header(*case, desc, sent_at))
        got = decode_header(forms.encode(*case, sent_at))
        assert want is not None and got == want
        # the second call takes the kept form
        assert decode_header(forms.encode(*case, sent_at)) == want


def test_a_form_changes_with_what_it_is_made_of():
    forms = HeaderForms(DESC)
    a = decode_header(forms.encode(DATA, 1, 7, 2, 0, "exchange", 0, 2, 1.0))
    b = decode_header(forms.encode(DATA, 2, 7, 2, 0, "exchange", 0, 2, 1.0))  # a new generation
    c = decode_header(forms.encode(DATA, 1, 7, 2, 0, "exchange", 1, 2, 1.0))  # another step
    assert (a.generation, b.generation) == (1, 2)
    assert (a.step, c.step) == (0, 1)


def test_the_forms_kept_are_bounded():
    forms = HeaderForms(DESC)
    for step in range(HeaderForms.MAX * 2 + 3):
        h = decode_header(forms.encode(DATA, 1, 7, 2, 0, "ring", step, 0, 1.0))
        assert h is not None and h.step == step
    assert len(forms) <= HeaderForms.MAX


@pytest.mark.parametrize("case", CASES)
def test_a_received_header_matches_only_the_one_its_fields_make(case):
    """HeaderForms.sent_at, the small-op path's check of what arrives (channel.py,
    take_small): a header matches only when every field is the one expected; anything else is
    left to decode_header."""
    forms = HeaderForms(DESC)
    sent = time.time()
    raw = HeaderForms(DESC).encode(*case, sent)
    assert forms.sent_at(raw, *case) == sent
    assert forms.sent_at(memoryview(raw), *case) == sent  # a ZeroMQ frame's header
    mtype, gen, seq, src, index, phase, step, chunk = case
    others = [
        (mtype ^ 1, gen, seq, src, index, phase, step, chunk),
        (mtype, gen + 1, seq, src, index, phase, step, chunk),
        (mtype, gen, seq + 1, src, index, phase, step, chunk),
        (mtype, gen, seq, src + 1, index, phase, step, chunk),
        (mtype, gen, seq, src, index + 1, phase, step, chunk),
        (mtype, gen, seq, src, index, phase + "x", step, chunk),
        (mtype, gen, seq, src, index, phase, step + 1, chunk),
        (mtype, gen, seq, src, index, phase, step, chunk + 1),
    ]
    for other in others:
        assert forms.sent_at(raw, *other) is None, other
    assert (
        HeaderForms(Descriptor("all_reduce", 2, "<f4", "sum", "direct", None)).sent_at(raw, *case)
        is None
    )  # another op's descriptor
    assert forms.sent_at(raw[:-1], *case) is None
    assert forms.sent_at(raw + b"\0", *case) is None
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0x40
    assert forms.sent_at(bytes(flipped), *case) is None
