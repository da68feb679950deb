"""Request IDs: the client's when well-formed, else a new random version-4 UUID in hex."""

from __future__ import annotations

import re
import uuid

from gateway.proxy.headers import new_request_id, pick_request_id


def test_a_new_id_is_a_version_4_uuid_in_32_hex_digits() -> None:
    ids = [new_request_id() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for value in ids:
        assert re.fullmatch(r"[0-9a-f]{32}", value)
        parsed = uuid.UUID(hex=value)
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122
        assert parsed.hex == value


def test_the_random_bits_vary_everywhere_but_the_version_and_variant() -> None:
    ids = [int(new_request_id(), 16) for _ in range(2000)]
    fixed = ~0 & ((1 << 128) - 1)
    for value in ids[1:]:
        fixed &= ~(value ^ ids[0])
    # Only the 4 version bits and the 2 variant bits are the same in every id.
    assert bin(fixed).count("1") == 6


def test_the_clients_id_is_kept_when_well_formed() -> None:
    assert pick_request_id(b"client-id_1.2") == "client-id_1.2"
    assert re.fullmatch(r"[0-9a-f]{32}", pick_request_id(b"bad id with spaces"))
    assert re.fullmatch(r"[0-9a-f]{32}", pick_request_id(None))
