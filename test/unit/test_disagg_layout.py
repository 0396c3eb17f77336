"""KVLayout byte offsets, compatibility messages, page checks; env helper; wire messages."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
import torch
from sglang_pd.disaggregation import messages as m
from sglang_pd.disaggregation.envs import DisaggEnvs
from sglang_pd.disaggregation.kv_layout import KVLayout


def make(
    num_pages: int = 6, page_size: int = 4, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return torch.zeros(3, 2, num_pages, page_size, 2, 8, dtype=dtype)


def test_from_tensor_and_offsets_match_tensor_addresses() -> None:
    buf = make(dtype=torch.bfloat16)
    lay = KVLayout.from_tensor(buf)
    assert (lay.num_layers, lay.num_pages, lay.page_size, lay.kv_heads, lay.head_dim) == (
        3,
        6,
        4,
        2,
        8,
    )
    assert lay.dtype == "bfloat16" and lay.device == "cpu" and lay.mem_type == "DRAM"
    assert lay.page_bytes == 4 * 2 * 8 * 2
    assert lay.region_bytes == buf.numel() * buf.element_size()
    for layer, kv, page in [(0, 0, 0), (2, 1, 5), (1, 0, 3)]:
        assert lay.base_addr + lay.page_offset(layer, kv, page) == buf[layer, kv, page].data_ptr()
    table = lay.descriptor_table()
    idx = lay.descriptor_indices(np.array([3, 1]))
    assert len(idx) == 3 * 2 * 2 and idx.dtype == np.int32
    # Layer-major order: (l0 K p3, l0 K p1, l0 V p3, ...).
    assert (
        table[idx[0], 0] == buf[0, 0, 3].data_ptr() and table[idx[1], 0] == buf[0, 0, 1].data_ptr()
    )
    assert table[idx[2], 0] == buf[0, 1, 3].data_ptr()
    assert set(table[:, 1].tolist()) == {lay.page_bytes}


def test_from_tensor_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError, match=r"\[num_layers, 2, num_pages"):
        KVLayout.from_tensor(torch.zeros(3, 3, 4, 4, 2, 8))
    with pytest.raises(ValueError, match="contiguous"):
        KVLayout.from_tensor(make().transpose(3, 4))
    with pytest.raises(ValueError, match="dtype 'int64' is not supported"):
        KVLayout.from_tensor(make().long())


def test_compatible_with_names_every_difference_but_allows_num_pages() -> None:
    a = KVLayout.from_tensor(make(num_pages=6))
    assert a.compatible_with(KVLayout.from_tensor(make(num_pages=50))) is None
    b = KVLayout.from_tensor(make(page_size=16, dtype=torch.float16))
    err = a.compatible_with(b)
    assert err is not None
    assert (
        "page_size: local=4 remote=16" in err and "dtype: local='float32' remote='float16'" in err
    )
    assert "only num_pages may differ" in err


def test_check_pages_messages() -> None:
    lay = KVLayout.from_tensor(make(num_pages=6))
    assert lay.check_pages([5, 1], "src").tolist() == [5, 1]
    with pytest.raises(ValueError, match=r"src: page ids must be in \[1, 5\].*min=0"):
        lay.check_pages([0, 1], "src")
    with pytest.raises(ValueError, match="max=6"):
        lay.check_pages([6], "src")
    with pytest.raises(ValueError, match="duplicate"):
        lay.check_pages([2, 2], "src")
    with pytest.raises(ValueError, match="empty"):
        lay.check_pages([], "src")


def test_layout_wire_roundtrip_and_validation() -> None:
    lay = KVLayout.from_tensor(make())
    reg = m.Register(
        room=2**62 + 5,
        client_id="d0",
        agent_name="decode-0",
        agent_metadata=b"\x00\x01",
        layout=lay,
        dst_pages=[1, 2, 3],
    )
    back = m.decode(m.encode(reg))
    assert back == reg and isinstance(back.layout, KVLayout)
    bad = msgspec.msgpack.encode(
        {
            "type": "register",
            "room": 1,
            "client_id": "c",
            "agent_name": "a",
            "agent_metadata": b"",
            "dst_pages": [1],
            "layout": {**lay.to_dict(), "device": "tpu"},
        }
    )
    with pytest.raises(msgspec.ValidationError, match="'cpu' or 'cuda:N'"):
        m.decode(bad)
    assert m.parse_kv_notif(m.kv_notif(2**63 - 1, 3, True)) == m.KVNotif(2**63 - 1, 3, True)
    n = m.parse_kv_notif(m.kv_notif(5, 0, True, b"a|b", pages=(2, 9)))
    assert n == m.KVNotif(5, 0, True, b"a|b", (2, 9))
    for bad in (b"something else", b"kv|x|1|1|0:1", b"kv|1|1|1", b"kv|1|1|2|0:1", b"kv|1|1|1|0-1"):
        assert m.parse_kv_notif(bad) is None, bad


def test_envs_defaults_parsing_and_errors() -> None:
    assert DisaggEnvs.load({}) == DisaggEnvs(300.0, 300.0, 5.0, 2, "UCX")
    env = DisaggEnvs.load(
        {
            "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "30",
            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "60",
            "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "0.5",
            "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "4",
            "SGLANG_DISAGGREGATION_NIXL_BACKEND": "LIBFABRIC",
        }
    )
    assert env == DisaggEnvs(30.0, 60.0, 0.5, 4, "LIBFABRIC")
    with pytest.raises(
        ValueError, match="SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT='5m' is not a valid int"
    ):
        DisaggEnvs.load({"SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "5m"})
    with pytest.raises(ValueError, match="HEARTBEAT_MAX_FAILURE='0' must be >= 1"):
        DisaggEnvs.load({"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "0"})
