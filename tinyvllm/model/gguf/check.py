"""Walk a GGUF file's header with every bound checked, before `gguf.GGUFReader` sees it.

GGUFReader trusts the file: a truncated file or a corrupt count surfaces as a NumPy
`cannot reshape`, an IndexError or a UnicodeDecodeError that names neither the file nor
the problem. `open_gguf` first walks the same structure itself, in GGUF v2/v3 layout:

    "GGUF", version u32, tensor_count u64, kv_count u64
    kv_count  x  key (u64 length + UTF-8), value type u32, value
    tensor_count x  name, n_dims u32, dims u64[n_dims] (fastest first), GGML type u32, offset u64
    padding to general.alignment (default 32), then the tensor data, each at its offset

and raises one `GGUFError` naming the file and what is wrong: where it is truncated, a
count that cannot fit in the bytes left, an unknown value or tensor type, tensor data
past the end of the file. Only a file that passes is handed to GGUFReader.
"""

import mmap
import os
import struct
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGUFReader
from gguf import GGMLQuantizationType as GGMLType
from gguf.constants import GGUFValueType

from tinyvllm.model.gguf.format import GGUFError

MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
_GGML_TYPE_IDS = {tensor_type.value for tensor_type in GGMLType}
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
# The fewest bytes one key/value pair and one tensor description can take: what a count must fit in.
_MIN_KV_BYTES = 8 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 4 + 8


def _quoted(name: str) -> str:
    """A key or tensor name for a message: quoted, and cut short when a corrupt length made it huge."""
    text = repr(name)
    return text if len(text) <= 64 else text[:60] + "...'"


class _Cursor:
    """Reads little-endian fields from the file's bytes, failing with the file's name and the offset."""

    def __init__(self, data: bytes, source: Path | str):
        self.data, self.source, self.offset = data, source, 0

    def fail(self, problem: str) -> GGUFError:
        return GGUFError(f"{self.source}: {problem}")

    def take(self, size: int, what: str) -> bytes:
        end = self.offset + size
        if end > len(self.data):
            raise self.fail(f"truncated at byte {len(self.data)} of {end} (reading {what} at byte {self.offset})")
        chunk, self.offset = self.data[self.offset : end], end
        return chunk

    def scalar(self, fmt: str, what: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        length = self.scalar("<Q", f"the length of {what}")
        raw = self.take(length, f"{what} ({length} bytes)")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise self.fail(f"{what} at byte {self.offset - length} is not UTF-8 ({error.reason})") from None

    def count(self, what: str, min_item_bytes: int) -> int:
        value = self.scalar("<Q", f"the count of {what}")
        left = len(self.data) - self.offset
        if value * min_item_bytes > left:
            raise self.fail(
                f"{what}: a count of {value} cannot be true, or the file is truncated: it needs at least "
                f"{value * min_item_bytes} more bytes and the file ends at byte {len(self.data)}"
            )
        return value


def _min_value_bytes(value_type: int) -> int:
    if value_type in _SCALARS:
        return struct.calcsize(_SCALARS[value_type])
    return 8 if value_type == GGUFValueType.STRING else 12  # an empty string or array


def _skip_value(cursor: _Cursor, value_type: int, key: str):
    """Step over one value, checked; returns it when it is a scalar (for general.alignment), else None."""
    if value_type in _SCALARS:
        return cursor.scalar(_SCALARS[value_type], f"the value of {_quoted(key)}")
    if value_type == GGUFValueType.STRING:
        cursor.string(f"the value of {_quoted(key)}")
        return None
    if value_type != GGUFValueType.ARRAY:
        raise cursor.fail(f"key {_quoted(key)} has unknown value type {value_type}")
    item_type = cursor.scalar("<I", f"the item type of {_quoted(key)}")
    if item_type not in _SCALARS and item_type not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
        raise cursor.fail(f"array {_quoted(key)} has unknown item type {item_type}")
    length = cursor.count(f"array {_quoted(key)}", _min_value_bytes(item_type))
    if item_type in _SCALARS:
        cursor.take(length * struct.calcsize(_SCALARS[item_type]), f"the items of {_quoted(key)}")
    else:
        for index in range(length):
            _skip_value(cursor, item_type, f"{key}[{index}]")
    return None


def _tensor_info(cursor: _Cursor, index: int) -> tuple[str, list[int], GGMLType, int]:
    name = cursor.string(f"the name of tensor #{index}")
    n_dims = cursor.scalar("<I", f"the dimension count of {_quoted(name)}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise cursor.fail(
            f"tensor {_quoted(name)} has {n_dims} dimensions, which cannot be true (GGML has 1 to {MAX_DIMS})"
        )
    dims = list(struct.unpack(f"<{n_dims}Q", cursor.take(8 * n_dims, f"the dimensions of {_quoted(name)}")))
    type_id = cursor.scalar("<I", f"the type of {_quoted(name)}")
    if type_id not in _GGML_TYPE_IDS:
        raise cursor.fail(f"tensor {_quoted(name)} has unknown GGML type id {type_id}")
    offset = cursor.scalar("<Q", f"the data offset of {_quoted(name)}")
    return name, dims, GGMLType(type_id), offset


def check_gguf(path: str | Path, data: bytes | mmap.mmap) -> None:
    """Raise a GGUFError naming `path` and the first thing wrong in `data` (the file's bytes), if any."""
    cursor = _Cursor(data, path)
    magic = cursor.take(4, "the magic number")
    if magic != MAGIC:
        raise cursor.fail(f"not a GGUF file (it starts with {magic!r}, not {MAGIC!r})")
    version = cursor.scalar("<I", "the version")
    if version not in SUPPORTED_VERSIONS:
        raise cursor.fail(f"GGUF version {version} is not supported (only {SUPPORTED_VERSIONS}, little-endian)")
    tensor_count = cursor.scalar("<Q", "the tensor count")
    kv_count = cursor.count("the key/value pairs", _MIN_KV_BYTES)
    if tensor_count * _MIN_TENSOR_INFO_BYTES > len(data):
        raise cursor.fail(
            f"a tensor count of {tensor_count} cannot be true, or the file is truncated: it needs at least "
            f"{tensor_count * _MIN_TENSOR_INFO_BYTES} bytes and the file ends at byte {len(data)}"
        )

    keys, alignment = set(), DEFAULT_ALIGNMENT
    for index in range(kv_count):
        key = cursor.string(f"key #{index}")
        if key in keys:
            raise cursor.fail(f"key {_quoted(key)} appears twice")
        keys.add(key)
        value_type = cursor.scalar("<I", f"the value type of {_quoted(key)}")
        value = _skip_value(cursor, value_type, key)
        if key == "general.alignment":
            if value_type != GGUFValueType.UINT32 or value <= 0 or value & (value - 1):
                raise cursor.fail(f"general.alignment must be a uint32 power of two, not {value!r}")
            alignment = value

    infos = [_tensor_info(cursor, index) for index in range(tensor_count)]
    data_start = -(-cursor.offset // alignment) * alignment
    names = set()
    for name, dims, tensor_type, offset in infos:
        if name in names:
            raise cursor.fail(f"tensor {_quoted(name)} appears twice")
        names.add(name)
        block_size, block_bytes = GGML_QUANT_SIZES[tensor_type]
        if dims[0] % block_size:
            raise cursor.fail(
                f"tensor {_quoted(name)} has rows of {dims[0]} values, "
                f"not whole {tensor_type.name} blocks of {block_size}"
            )
        elements = 1
        for dim in dims:
            elements *= dim
        end = data_start + offset + elements // block_size * block_bytes
        if offset % alignment or end > len(data):
            where = "is misaligned" if offset % alignment else f"ends at byte {end}, past the end of the file"
            raise cursor.fail(f"tensor {_quoted(name)} data (offset {offset}) {where} ({len(data)} bytes)")


def open_gguf(path: str | Path) -> GGUFReader:
    """GGUFReader on `path`, once `check_gguf` has found nothing wrong with it."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            if os.fstat(file.fileno()).st_size == 0:  # mmap refuses an empty file
                check_gguf(path, b"")
            with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:  # the header only is read
                check_gguf(path, data)
    except OSError as error:
        raise GGUFError(f"{path}: cannot be read ({error.strerror})") from None
    return GGUFReader(path)
