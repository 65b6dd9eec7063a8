"""Reject rules: their wire flags and the order in which the server applies them."""

from __future__ import annotations

import itertools

import pytest

from stratus_client import RejectRules, Status, codec


def test_flag_bits_are_the_specifications():
    assert RejectRules().flags == 0
    assert RejectRules(doesnt_exist=True).flags == 0b0001
    assert RejectRules(exists=True).flags == 0b0010
    assert RejectRules(version_le_given=True).flags == 0b0100
    assert RejectRules(version_ne_given=True).flags == 0b1000


def test_wire_encoding_is_given_version_then_flags():
    rules = RejectRules(given_version=0x0102030405060708, exists=True, version_ne_given=True)
    assert codec.BodyWriter().rules(rules).to_bytes() == bytes.fromhex("0807060504030201") + b"\x0a"
    assert codec.BodyWriter().rules(None).to_bytes() == bytes(9)


def test_every_flag_combination_round_trips():
    for bits in range(16):
        rules = RejectRules.from_wire(9, bits)
        assert rules.flags == bits
        assert rules.given_version == 9


@pytest.mark.parametrize("flags", [0x10, 0x80, 0xFF])
def test_undefined_flag_bits_are_refused(flags):
    with pytest.raises(ValueError):
        RejectRules.from_wire(0, flags)


def test_given_version_must_be_a_64_bit_version():
    with pytest.raises(ValueError):
        RejectRules(given_version=-1)
    with pytest.raises(ValueError):
        RejectRules(given_version=1 << 64)


def test_named_constructors():
    assert RejectRules.only_if_missing() == RejectRules(exists=True)
    assert RejectRules.only_if_exists() == RejectRules(doesnt_exist=True)
    assert RejectRules.only_if_version(4) == RejectRules(given_version=4, version_ne_given=True)
    assert RejectRules.only_if_newer_than(4) == RejectRules(given_version=4, version_le_given=True)


@pytest.mark.parametrize(
    "rules, current_version, expected",
    [
        (RejectRules(), 0, Status.OK),
        (RejectRules(), 7, Status.OK),
        (RejectRules(doesnt_exist=True), 0, Status.OBJECT_DOESNT_EXIST),
        (RejectRules(doesnt_exist=True), 1, Status.OK),
        (RejectRules(exists=True), 1, Status.OBJECT_EXISTS),
        (RejectRules(exists=True), 0, Status.OK),
        (RejectRules(given_version=5, version_le_given=True), 5, Status.WRONG_VERSION),
        (RejectRules(given_version=5, version_le_given=True), 4, Status.WRONG_VERSION),
        (RejectRules(given_version=5, version_le_given=True), 6, Status.OK),
        (RejectRules(given_version=5, version_le_given=True), 0, Status.WRONG_VERSION),
        (RejectRules(given_version=5, version_ne_given=True), 5, Status.OK),
        (RejectRules(given_version=5, version_ne_given=True), 6, Status.WRONG_VERSION),
        (RejectRules(given_version=0, version_ne_given=True), 0, Status.OK),
        # Order: doesnt_exist before the version rules, exists before the version rules.
        (
            RejectRules(doesnt_exist=True, version_ne_given=True, given_version=3),
            0,
            Status.OBJECT_DOESNT_EXIST,
        ),
        (RejectRules(exists=True, version_le_given=True, given_version=9), 3, Status.OBJECT_EXISTS),
    ],
)
def test_rules_are_checked_in_the_specifications_order(rules, current_version, expected):
    assert rules.check(current_version) is expected


def test_unconditional_rules_never_reject():
    for version in (0, 1, 2**63, 2**64 - 1):
        assert RejectRules().check(version) is Status.OK


def test_first_matching_rule_decides_for_every_combination():
    """Against a straightforward restatement of the specification's sentence."""
    for bits, given, current in itertools.product(range(16), (0, 3), (0, 2, 3, 4)):
        rules = RejectRules.from_wire(given, bits)
        expected = Status.OK
        for applies, status in [
            (rules.doesnt_exist and current == 0, Status.OBJECT_DOESNT_EXIST),
            (rules.exists and current != 0, Status.OBJECT_EXISTS),
            (rules.version_le_given and current <= given, Status.WRONG_VERSION),
            (rules.version_ne_given and current != given, Status.WRONG_VERSION),
        ]:
            if applies:
                expected = status
                break
        assert rules.check(current) is expected, (bits, given, current)
