"""Image restoration (the restored picture per image): tiled predict plan, results, paired datasets,
the built-in synthetic set, loss, PSNR / SSIM evaluation, and the restore families' base."""
from .results import RestoredImage
from .task import (
                   RestoreEvaluator,
                   RestoreLoss,
                   RestoreOptions,
                   RestorePlan,
                   RestoreTask,
                   blend_window,
                   restore_metrics,
)

__all__ = ["RestoreEvaluator", "RestoreLoss", "RestoreOptions", "RestorePlan", "RestoreTask", "RestoredImage",
           "blend_window", "restore_metrics"]
