"""Readers of public datasets: SentEval's STS tasks, BEIR retrieval tasks, the Lee corpus."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "beir": ("QRELS_HEADER", "BeirTask", "read_qrels", "read_queries"),
    "lee": ("background_sentences", "document_vectors", "documents", "judgement_spearman",
            "rated_sentences", "sentences", "similarities"),
    "sts": ("POSITIVE_GOLD", "STS_SUBSETS", "TASKS", "Pairs", "Task", "cosine", "load_tasks",
            "pair_spearman", "pair_vectors", "positive_pairs", "read_sick", "read_sts_subset",
            "read_stsb", "read_stsb_splits", "score", "sentences_of", "spearman", "undefined"),
})
