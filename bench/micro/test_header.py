"""The msgpack header every message carries: its cost bounds the small-message latency."""

from collectives.transport.wire import DATA, decode_header, encode_header

DESC = ["all_reduce", 262144, "<f4", "sum", "ring", None]


def test_encode_header(benchmark):
    raw = benchmark(encode_header, DATA, 0, 12345, 1, 3, "reduce-scatter", 2, 7, DESC)
    assert decode_header(raw) is not None


def test_decode_header(benchmark):
    raw = encode_header(DATA, 0, 12345, 1, 3, "reduce-scatter", 2, 7, DESC)
    h = benchmark(decode_header, raw)
    assert h is not None and h.seq == 12345
