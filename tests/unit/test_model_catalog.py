"""Model shapes, links and devices: docs/reference.md §1-§3 catalogues and the bytes derived from them."""

import pytest

from kvtransit.model.catalog.devices import DEVICES, device_by_name
from kvtransit.model.catalog.links import LINKS, link_by_name
from kvtransit.model.catalog.models import MODELS, ModelSpec, model_by_name
from kvtransit.model.cost.handoff import weight_load_s
from kvtransit.model.errors import ConfigError


@pytest.mark.parametrize(
    "name,kv_per_token,handoff_mb",
    [
        ("llama3-8b", 131_072, "268.4"),
        ("llama3-70b", 327_680, "671.1"),
        ("mistral-7b", 131_072, "268.4"),
        ("mixtral-8x7b", 131_072, "268.4"),
        ("llama3.2-1b", 32_768, "67.1"),
        ("smollm2-135m", 23_040, "47.2"),
    ],
)
def test_kv_bytes_per_token_and_2048_token_handoff_match_reference_table(name, kv_per_token, handoff_mb):
    model = model_by_name(name)
    assert model.kv_bytes_per_token == kv_per_token
    assert f"{model.kv_bytes(2048) / 1e6:.1f}" == handoff_mb


def test_exact_handoff_bytes_of_reference_section_1():
    assert MODELS["llama3-8b"].kv_bytes(2048) == 268_435_456
    assert MODELS["llama3-70b"].kv_bytes(2048) == 671_088_640


def test_bf16_weights_and_pcie5_load_times_match_reference_section_1():
    assert f"{MODELS['llama3-8b'].resident_weight_bytes / 1e9:.2f}" == "16.06"
    assert f"{MODELS['llama3-70b'].resident_weight_bytes / 1e9:.2f}" == "141.10"
    assert f"{weight_load_s(MODELS['llama3-8b']):.2f}" == "0.25"
    assert f"{weight_load_s(MODELS['llama3-70b']):.2f}" == "2.20"


def test_mixture_of_experts_computes_with_active_experts_but_holds_all():
    dense, moe = MODELS["mistral-7b"], MODELS["mixtral-8x7b"]
    expert_mlp = dense.layers * 3 * dense.d_model * dense.d_ff
    assert moe.matmul_params - dense.matmul_params == expert_mlp  # 2 active vs 1
    assert moe.layer_params - dense.layer_params == 7 * expert_mlp  # 8 held vs 1


def test_model_shape_text_builds_the_same_model_as_the_catalogue():
    custom = ModelSpec.from_shape("layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256")
    reference = MODELS["llama3-8b"]
    assert custom.name == "custom"
    assert (custom.kv_bytes_per_token, custom.matmul_params, custom.resident_weight_bytes) == (
        reference.kv_bytes_per_token, reference.matmul_params, reference.resident_weight_bytes)


@pytest.mark.parametrize(
    "shape,message",
    [
        ("layers=32,d_model=4096", "missing d_ff, kv_heads, heads, vocab"),
        ("layers=32,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256,depth=3", "unknown key 'depth'"),
        ("layers=-1,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256", "layers must be > 0"),
        ("layers=x,d_model=4096,heads=32,kv_heads=8,d_ff=14336,vocab=128256", "layers must be an integer"),
        ("layers=2,d_model=100,heads=3,kv_heads=1,d_ff=8,vocab=8", "not a multiple of heads"),
        ("layers=2,d_model=96,heads=3,kv_heads=2,d_ff=8,vocab=8", "not a multiple of kv_heads"),
        ("layers=2,d_model=96,heads=3,kv_heads=3,d_ff=8,vocab=8,experts=2,experts_active=4", "experts_active 4 >"),
    ],
)
def test_bad_model_shape_names_what_is_wrong(shape, message):
    with pytest.raises(ConfigError, match=message):
        ModelSpec.from_shape(shape)


@pytest.mark.parametrize(
    "lookup,kind,catalogue",
    [(model_by_name, "model", MODELS), (link_by_name, "link", LINKS), (device_by_name, "device", DEVICES)],
)
def test_unknown_names_list_the_valid_choices(lookup, kind, catalogue):
    with pytest.raises(ConfigError) as info:
        lookup("nope")
    message = str(info.value)
    assert message.startswith(f"unknown {kind} 'nope'")
    assert all(name in message for name in catalogue)


def test_links_of_reference_section_2():
    expected = {  # bandwidth GB/s, latency µs, pJ/bit
        "nvlink4": (450, 5, 5), "ib-ndr": (50, 10, 15), "eth-100g": (12.5, 20, 15), "eth-25g": (3.125, 20, 15),
        "pcie5": (64, 5, 6), "pcie4": (32, 5, 6),
    }
    for name, (gbps, latency_us, pj) in expected.items():
        link = LINKS[name]
        assert link.bandwidth_Bps == pytest.approx(gbps * 1e9)
        assert link.latency_s == pytest.approx(latency_us * 1e-6)
        assert link.pj_per_bit == pj
    assert LINKS["qsfp56"].bandwidth_Bps == pytest.approx(25e9)


def test_link_transfer_time_and_energy_formulas():
    link = LINKS["eth-25g"]
    assert link.transfer_time_s(3.125e9) == pytest.approx(20e-6 + 1.0)
    assert link.energy_j(1e9) == pytest.approx(1e9 * 8 * 15e-12)
    with pytest.raises(ConfigError, match="bytes must be >= 0"):
        link.transfer_time_s(-1)
