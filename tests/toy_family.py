"""A model family adapter written outside the harness package, as a plugin would write one:
OLMo 3 (`Olmo3ForCausalLM`), OLMo 2's block (no norm before the sublayers, QK-norm over the whole
projection) with sliding-window layers and a rotary table per layer type.  It imports only the
declared extension surface (harness.extend); tests/test_extension_points.py registers it and runs
`check_family` on a random model built by `build`."""

from __future__ import annotations

from pathlib import Path

from harness.extend import Family

FAMILY = Family(
    name="olmo3",
    title="OLMo 3",
    architectures=("Olmo3ForCausalLM",),
    model_types=("olmo3",),
    qk_norm="projection",
    rotary="layer_type",
    windows="module",
    features="as OLMo 2, plus sliding-window layers with their own rotary table",
)


def build(out: Path, seed: int = 0) -> Path:
    """A random 3-layer OLMo 3 (layers sliding, full, sliding; window 5; the two layer types' rotary
    bases differ), weights perturbed away from their initial values so that nothing hides."""
    import torch
    import transformers as tf

    cfg = tf.Olmo3Config(vocab_size=100, hidden_size=48, num_hidden_layers=3, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, sliding_window=5, eos_token_id=0,
                         layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                         rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "default", "rope_theta": 500000.0}})
    torch.manual_seed(seed)
    model = tf.Olmo3ForCausalLM(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
            else:
                gain = 2.0 if "q_proj" in name or "k_proj" in name else 1.0  # sharp attention
                p.copy_(torch.randn(p.shape, generator=g) * gain / p.shape[-1] ** 0.5)
    model.save_pretrained(str(out))
    (out / "generation_config.json").unlink(missing_ok=True)
    return out
