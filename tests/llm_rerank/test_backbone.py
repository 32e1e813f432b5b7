"""llm_rerank.backbone: which precision ``auto`` loads on this machine."""


def test_auto_precision_is_bf16_only_where_the_machine_computes_it_natively(monkeypatch) -> None:
    import torch

    from llm_rerank.backbone import resolve_precision

    assert resolve_precision("fp32") == "fp32" and resolve_precision("int8") == "int8"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert resolve_precision("auto") == ("bf16" if native else "fp32")
