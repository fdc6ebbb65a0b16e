"""A head outside bertflow: ONNX and torch.export graphs, the sentence-transformers pipeline and
its model card."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "card": ("details", "model_card", "summary", "tagline"),
    "graphs": ("INPUT_NAME", "OUTPUT_NAME", "check_destination", "export_onnx", "export_program"),
    "pipeline": ("EncoderModule", "HeadModule", "PoolingModule", "build_pipeline", "load_pipeline",
                 "save_pipeline"),
})
