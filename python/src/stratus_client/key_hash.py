"""The key hash: which tablet, and so which master, holds a key.

A tablet is a range of key hashes of one table, so a client must hash every key exactly as the
servers do, forever (docs/design/wire-protocol.md, "Key hash"): XXH3-64 of the key bytes, seeded
with the table id. This module is a pure-Python port of XXH3-64 (xxHash 0.8, as in the
``xxhash-rust`` crate the servers use), so the client needs no compiled dependency. Keys are at
most 65 535 bytes, so the speed of pure Python is acceptable; ``tests/test_key_hash.py`` pins the
result for every code path against values computed by the Rust implementation.

Enumeration order is by bit-reversed key hash (``reverse_bits``), which this module provides
too because resuming an enumeration after a given key needs it.
"""

from __future__ import annotations

__all__ = ["key_hash", "reverse_bits", "xxh3_64_with_seed"]

_MASK_64 = (1 << 64) - 1

_PRIME32_1 = 0x9E3779B1
_PRIME32_2 = 0x85EBCA77
_PRIME32_3 = 0xC2B2AE3D
_PRIME64_1 = 0x9E3779B185EBCA87
_PRIME64_2 = 0xC2B2AE3D27D4EB4F
_PRIME64_3 = 0x165667B19E3779F9
_PRIME64_4 = 0x85EBCA77C2B2AE63
_PRIME64_5 = 0x27D4EB2F165667C5
_PRIME_MX1 = 0x165667919E3779F9
_PRIME_MX2 = 0x9FB21C651E98DF25

_DEFAULT_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_SECRET_SIZE_MIN = 136
_STRIPE_BYTES = 64
_SECRET_CONSUME_RATE = 8
_ACCUMULATOR_COUNT = 8
_SECRET_MERGE_ACCUMULATORS_START = 11
_SECRET_LAST_ACCUMULATOR_START = 7
_MID_SIZE_MAX = 240


def _read_u32(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 4], "little")


def _read_u64(data: bytes, offset: int) -> int:
    return int.from_bytes(data[offset : offset + 8], "little")


def _swap_bytes_64(value: int) -> int:
    return int.from_bytes(value.to_bytes(8, "little"), "big")


def _swap_bytes_32(value: int) -> int:
    return int.from_bytes(value.to_bytes(4, "little"), "big")


def _rotate_left_64(value: int, count: int) -> int:
    return ((value << count) | (value >> (64 - count))) & _MASK_64


def _multiply_fold_128_to_64(left: int, right: int) -> int:
    """The 128-bit product of two 64-bit values, its halves xor-ed together."""
    product = left * right
    return (product & _MASK_64) ^ (product >> 64)


def _xxh64_avalanche(value: int) -> int:
    value ^= value >> 33
    value = (value * _PRIME64_2) & _MASK_64
    value ^= value >> 29
    value = (value * _PRIME64_3) & _MASK_64
    value ^= value >> 32
    return value


def _xxh3_avalanche(value: int) -> int:
    value ^= value >> 37
    value = (value * _PRIME_MX1) & _MASK_64
    value ^= value >> 32
    return value


def _rrmxmx(value: int, length: int) -> int:
    """XXH3's stronger avalanche, used for 4..8-byte inputs."""
    value ^= _rotate_left_64(value, 49) ^ _rotate_left_64(value, 24)
    value = (value * _PRIME_MX2) & _MASK_64
    value ^= (value >> 35) + length
    value = (value * _PRIME_MX2) & _MASK_64
    value ^= value >> 28
    return value


def _mix_16_bytes(
    data: bytes, data_offset: int, secret: bytes, secret_offset: int, seed: int
) -> int:
    low = _read_u64(data, data_offset) ^ ((_read_u64(secret, secret_offset) + seed) & _MASK_64)
    high = _read_u64(data, data_offset + 8) ^ (
        (_read_u64(secret, secret_offset + 8) - seed) & _MASK_64
    )
    return _multiply_fold_128_to_64(low, high)


def _hash_0_to_16(data: bytes, seed: int, secret: bytes) -> int:
    length = len(data)
    if length > 8:
        flip_low = ((_read_u64(secret, 24) ^ _read_u64(secret, 32)) + seed) & _MASK_64
        flip_high = ((_read_u64(secret, 40) ^ _read_u64(secret, 48)) - seed) & _MASK_64
        input_low = _read_u64(data, 0) ^ flip_low
        input_high = _read_u64(data, length - 8) ^ flip_high
        accumulator = (
            length
            + _swap_bytes_64(input_low)
            + input_high
            + _multiply_fold_128_to_64(input_low, input_high)
        ) & _MASK_64
        return _xxh3_avalanche(accumulator)
    if length >= 4:
        seed ^= _swap_bytes_32(seed & 0xFFFFFFFF) << 32
        first = _read_u32(data, 0)
        last = _read_u32(data, length - 4)
        flip = ((_read_u64(secret, 8) ^ _read_u64(secret, 16)) - seed) & _MASK_64
        keyed = ((last + (first << 32)) & _MASK_64) ^ flip
        return _rrmxmx(keyed, length)
    if length > 0:
        combined = (data[0] << 16) | (data[length >> 1] << 24) | data[length - 1] | (length << 8)
        flip = ((_read_u32(secret, 0) ^ _read_u32(secret, 4)) + seed) & _MASK_64
        return _xxh64_avalanche(combined ^ flip)
    return _xxh64_avalanche(seed ^ _read_u64(secret, 56) ^ _read_u64(secret, 64))


def _hash_17_to_128(data: bytes, seed: int, secret: bytes) -> int:
    length = len(data)
    accumulator = (length * _PRIME64_1) & _MASK_64
    if length > 32:
        if length > 64:
            if length > 96:
                accumulator += _mix_16_bytes(data, 48, secret, 96, seed)
                accumulator += _mix_16_bytes(data, length - 64, secret, 112, seed)
            accumulator += _mix_16_bytes(data, 32, secret, 64, seed)
            accumulator += _mix_16_bytes(data, length - 48, secret, 80, seed)
        accumulator += _mix_16_bytes(data, 16, secret, 32, seed)
        accumulator += _mix_16_bytes(data, length - 32, secret, 48, seed)
    accumulator += _mix_16_bytes(data, 0, secret, 0, seed)
    accumulator += _mix_16_bytes(data, length - 16, secret, 16, seed)
    return _xxh3_avalanche(accumulator & _MASK_64)


def _hash_129_to_240(data: bytes, seed: int, secret: bytes) -> int:
    start_offset = 3
    last_offset = 17
    length = len(data)
    accumulator = (length * _PRIME64_1) & _MASK_64
    for index in range(8):
        accumulator += _mix_16_bytes(data, 16 * index, secret, 16 * index, seed)
    accumulator = _xxh3_avalanche(accumulator & _MASK_64)
    for index in range(8, length // 16):
        accumulator += _mix_16_bytes(
            data, 16 * index, secret, 16 * (index - 8) + start_offset, seed
        )
    accumulator += _mix_16_bytes(data, length - 16, secret, _SECRET_SIZE_MIN - last_offset, seed)
    return _xxh3_avalanche(accumulator & _MASK_64)


def _accumulate_stripe(
    accumulators: list[int], data: bytes, data_offset: int, secret: bytes, secret_offset: int
) -> None:
    for lane in range(_ACCUMULATOR_COUNT):
        data_value = _read_u64(data, data_offset + 8 * lane)
        data_key = data_value ^ _read_u64(secret, secret_offset + 8 * lane)
        accumulators[lane ^ 1] = (accumulators[lane ^ 1] + data_value) & _MASK_64
        accumulators[lane] = (
            accumulators[lane] + (data_key & 0xFFFFFFFF) * (data_key >> 32)
        ) & _MASK_64


def _scramble(accumulators: list[int], secret: bytes, secret_offset: int) -> None:
    for lane in range(_ACCUMULATOR_COUNT):
        value = accumulators[lane]
        value ^= value >> 47
        value ^= _read_u64(secret, secret_offset + 8 * lane)
        accumulators[lane] = (value * _PRIME32_1) & _MASK_64


def _hash_long(data: bytes, secret: bytes) -> int:
    length = len(data)
    accumulators = [
        _PRIME32_3,
        _PRIME64_1,
        _PRIME64_2,
        _PRIME64_3,
        _PRIME64_4,
        _PRIME32_2,
        _PRIME64_5,
        _PRIME32_1,
    ]
    stripes_per_block = (len(secret) - _STRIPE_BYTES) // _SECRET_CONSUME_RATE
    block_bytes = _STRIPE_BYTES * stripes_per_block
    block_count = (length - 1) // block_bytes
    for block in range(block_count):
        for stripe in range(stripes_per_block):
            _accumulate_stripe(
                accumulators,
                data,
                block * block_bytes + stripe * _STRIPE_BYTES,
                secret,
                stripe * _SECRET_CONSUME_RATE,
            )
        _scramble(accumulators, secret, len(secret) - _STRIPE_BYTES)
    last_stripes = ((length - 1) - block_bytes * block_count) // _STRIPE_BYTES
    for stripe in range(last_stripes):
        _accumulate_stripe(
            accumulators,
            data,
            block_count * block_bytes + stripe * _STRIPE_BYTES,
            secret,
            stripe * _SECRET_CONSUME_RATE,
        )
    _accumulate_stripe(
        accumulators,
        data,
        length - _STRIPE_BYTES,
        secret,
        len(secret) - _STRIPE_BYTES - _SECRET_LAST_ACCUMULATOR_START,
    )
    result = (length * _PRIME64_1) & _MASK_64
    for pair in range(4):
        offset = _SECRET_MERGE_ACCUMULATORS_START + 16 * pair
        result += _multiply_fold_128_to_64(
            accumulators[2 * pair] ^ _read_u64(secret, offset),
            accumulators[2 * pair + 1] ^ _read_u64(secret, offset + 8),
        )
    return _xxh3_avalanche(result & _MASK_64)


def _secret_for_seed(seed: int) -> bytes:
    """XXH3's seeded secret for long inputs: each 16-byte round is (low + seed, high - seed)."""
    if seed == 0:
        return _DEFAULT_SECRET
    derived = bytearray()
    for offset in range(0, len(_DEFAULT_SECRET), 16):
        derived += ((_read_u64(_DEFAULT_SECRET, offset) + seed) & _MASK_64).to_bytes(8, "little")
        derived += ((_read_u64(_DEFAULT_SECRET, offset + 8) - seed) & _MASK_64).to_bytes(
            8, "little"
        )
    return bytes(derived)


def xxh3_64_with_seed(data: bytes, seed: int) -> int:
    """XXH3-64 of ``data`` with a 64-bit ``seed`` (xxHash 0.8), as an unsigned integer."""
    if not 0 <= seed <= _MASK_64:
        raise ValueError(f"seed {seed} is not a 64-bit unsigned integer")
    data = bytes(data)
    length = len(data)
    if length <= 16:
        return _hash_0_to_16(data, seed, _DEFAULT_SECRET)
    if length <= 128:
        return _hash_17_to_128(data, seed, _DEFAULT_SECRET)
    if length <= _MID_SIZE_MAX:
        return _hash_129_to_240(data, seed, _DEFAULT_SECRET)
    return _hash_long(data, _secret_for_seed(seed))


def key_hash(table_id: int, key: bytes) -> int:
    """The hash that places ``key`` of table ``table_id`` in a tablet."""
    return xxh3_64_with_seed(key, table_id)


def reverse_bits(value: int) -> int:
    """``value`` with its 64 bits in reverse order (bit 0 becomes bit 63): enumeration order."""
    return int(f"{value:064b}"[::-1], 2)
