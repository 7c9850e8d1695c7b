"""Training draft heads for a target (self-distillation); torch is imported when training runs.

    from exactdraft.training import TrainingSettings, train_draft_head
    train_draft_head(xd.Generator.from_pretrained(None), "heads/smollm2")
"""

from exactdraft.training.trainer import TrainingSettings, train_draft_head

__all__ = ["TrainingSettings", "train_draft_head"]
