"""The methods compared without labels, and the STS and retrieval harnesses and diagnostics that
score them."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "diagnose": ("PLOTS", "STSB_SPLITS", "diagnose", "method_points", "plot_all",
                 "token_frequencies"),
    "methods": ("METHODS", "Method", "flow_by_recipe", "make_method"),
    "retrieval": ("FIT_SOURCES", "IDENTICAL_IDS_IGNORED", "TOP", "evaluate_retrieval",
                  "format_retrieval_table", "ignores_identical_ids", "ranking", "score_run",
                  "top_hits", "without_identical_ids"),
    "sts": ("AGGREGATIONS", "check_rows_destination", "evaluate", "evaluate_method",
            "format_table", "method_maker", "pair_measures", "row_key", "summarise",
            "undefined_notes"),
})
