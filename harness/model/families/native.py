"""TransformerLens's native models (`config.json` of TransformerBridgeConfig fields, `boot_native`)."""

from .family import NATIVE, Family

FAMILY = Family(name="native", title="TransformerLens native", architectures=(NATIVE,), rotary="none",
                features="learned positions, LayerNorm or RMSNorm, attention-only or with MLPs")
