"""core.copy.DLPackLayout (src/bindings/dlpack_layout.h): a tensor's layout through its type's
DLPack C exchange table, checked against what PyTorch's own methods say of the same tensor."""

import pytest

from jax_amem._native import core

torch = pytest.importorskip("torch")

# DLPack's type codes and device types (dlpack.h): the values the words carry.
FLOAT, INT, UINT, BFLOAT, BOOL = 2, 0, 1, 4, 6
CPU, CUDA = 1, 2
DTYPES = {torch.float32: (FLOAT, 32), torch.float16: (FLOAT, 16), torch.bfloat16: (BFLOAT, 16),
          torch.float64: (FLOAT, 64), torch.int8: (INT, 8), torch.int64: (INT, 64), torch.uint8: (UINT, 8),
          torch.bool: (BOOL, 8)}


def layout():
    try:
        return core.copy.DLPackLayout(torch.Tensor)
    except TypeError:
        pytest.skip(f"PyTorch {torch.__version__} has no DLPack C exchange table")


def expected(tensor, device_type=CPU):
    code, bits = DTYPES[tensor.dtype]
    index = tensor.device.index or 0
    return (tensor.data_ptr(), device_type, index, tensor.dim(), code | bits << 8 | 1 << 16, 0,
            *tensor.shape, *tensor.stride())


def tensors():
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    yield "contiguous", base
    yield "a transposed view at an offset", base[2:5, 1:].t()
    yield "a parameter (a subclass)", torch.nn.Parameter(torch.zeros(3, 2))
    yield "0-d", torch.tensor(1.5)
    yield "empty", torch.zeros(0, 3)
    for dtype in DTYPES:
        yield str(dtype), torch.zeros(4, 2, dtype=dtype)
    with torch.inference_mode():
        yield "an inference tensor", torch.zeros(5)


@pytest.mark.parametrize("name, tensor", list(tensors()), ids=[name for name, _ in tensors()])
def test_the_words_are_what_pytorch_says_of_the_tensor(name, tensor):
    assert layout()(tensor) == expected(tensor), name


def test_a_change_of_shape_strides_or_address_changes_the_words():
    read = layout()
    tensor = torch.zeros(8, 4)
    before = read(tensor)
    tensor.data = tensor.data.view(4, 8)  # same address, no version counter moved
    assert read(tensor) != before and read(tensor)[0] == before[0]
    tensor.t_()
    assert read(tensor)[-2:] == (1, 8)
    tensor.set_(torch.zeros(4, 8))
    assert read(tensor)[0] != before[0]


def test_what_is_not_a_tensor_of_the_type_is_refused_by_name():
    read = layout()
    for thing, name in ((3, "int"), ("w", "str"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"a {name} is not a Tensor"):
            read(thing)


@pytest.mark.parametrize("given, match", [
    (int, "<class 'int'> has no DLPack 1.x C exchange table"),
    (type("Impostor", (), {"__dlpack_c_exchange_api__": 5}), "Impostor'> has no DLPack"),
    (type("Named", (), {"__c_dlpack_exchange_api__": 12345}), "Named'> has no DLPack"),  # an int is no table
    (torch.zeros(2), "give the tensors' type"),
])
def test_a_type_without_a_usable_table_is_refused(given, match):
    with pytest.raises(TypeError, match=match):
        core.copy.DLPackLayout(given)


@pytest.mark.gpu
def test_a_cuda_tensor_names_its_device():
    read = layout()
    device = torch.cuda.device_count() - 1
    tensor = torch.zeros(3, 5, device=f"cuda:{device}")[:, 1:]
    assert read(tensor) == expected(tensor, CUDA)
