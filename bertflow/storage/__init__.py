"""How bytes reach disk and come back: atomic writes and checks, artifact folders, text and
corpus readers, tables read by rows."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "artifacts": ("HEAD_FOLDER", "INDEX_FOLDER", "MANIFEST", "PIPELINE_FOLDER", "PLOTS_FOLDER",
                  "FolderFormat", "write_manifest"),
    "corpus": ("Corpus", "corpus_sha256", "document", "read_corpus"),
    "files": ("Checked", "Recheck", "atomic_directory", "atomic_file", "check_finite",
              "check_outputs", "disk_errors", "fsync", "identity", "iter_sentences", "meta_path",
              "read_json", "read_sentences", "refuse_link", "remove_stale_temporaries",
              "sha256_file", "write_json"),
    "jsonl": ("field", "read_lines", "record_id", "records", "unicode_text"),
    "rows": ("ArrayRows", "Moments", "Rows", "as_rows", "blocks", "moments"),
})
