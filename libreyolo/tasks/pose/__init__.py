"""Pose estimation (keypoints): predict plan and the Keypoints result field."""
from .results import COCO_FLIP_IDX, COCO_KEYPOINT_NAMES, COCO_SIGMAS, COCO_SKELETON, Keypoints
from .task import PosePlan, PoseTask

__all__ = ["COCO_FLIP_IDX", "COCO_KEYPOINT_NAMES", "COCO_SIGMAS", "COCO_SKELETON", "Keypoints", "PosePlan",
           "PoseTask"]
