"""How scripts/analysis/param_table.py counts a model's parameters: built as ``fairseq-train --arch NAME``
builds it, on the meta device (shapes only), shared tensors counted once."""



from scripts.analysis.analysis_common import build_arch

SHARING = {
    "all": ["--share-all-embeddings"],
    "decoder": ["--share-decoder-input-output-embed"],
    "none": [],
}


def count_parameters(arch: str, extra: list[str], vocab_size: int, target_vocab_size: int | None = None) -> int:
    """Parameters of ``--arch arch`` as fairseq-train builds it, shared parameters counted once."""
    model = build_arch(arch, vocab_size, extra, meta=True, target_vocab_size=target_vocab_size)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a shared tensor once
