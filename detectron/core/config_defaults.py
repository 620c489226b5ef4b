"""The key tree of the one global config, `cfg`: every key with its default (Detectron's names).

What the keys mean is Detectron's (its core/config.py); docs/CONFIG.md lists what this port adds or
reads differently. The merge and type rules live in core/config.py, which every tool goes through.
"""

import math
import os

from yacs.config import CfgNode as _YacsCfgNode


class CfgNode(_YacsCfgNode):
    """A yacs node that also answers Detectron's AttrDict freezing API."""

    def immutable(self, is_immutable):
        """Freeze (True) or unfreeze (False) this node and every node below it."""
        self._immutable(is_immutable)

    def is_immutable(self):
        return self.is_frozen()


__C = CfgNode()
cfg = __C

# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
__C.TRAIN = CfgNode()
__C.TRAIN.WEIGHTS = ''  # initial weights: a path or a URL
__C.TRAIN.DATASETS = ()  # dataset catalog names; training uses their union
__C.TRAIN.SCALES = (600,)  # shorter-side sizes; one is drawn per image
__C.TRAIN.MAX_SIZE = 1000
__C.TRAIN.IMS_PER_BATCH = 2  # images per GPU
# port: images per process, one entry per process in rank order (e.g. CenterNet's chunk sizes);
# () = TRAIN.IMS_PER_BATCH on every process
__C.TRAIN.RANK_IMS_PER_BATCH = ()
__C.TRAIN.BATCH_SIZE_PER_IM = 64  # RoIs per image for the box head
__C.TRAIN.FG_FRACTION = 0.25
__C.TRAIN.FG_THRESH = 0.5
__C.TRAIN.BG_THRESH_HI = 0.5
__C.TRAIN.BG_THRESH_LO = 0.0
__C.TRAIN.USE_FLIPPED = True
__C.TRAIN.BBOX_THRESH = 0.5
__C.TRAIN.SNAPSHOT_ITERS = 80000  # checkpoint every int(SNAPSHOT_ITERS / NUM_GPUS) iterations
__C.TRAIN.PROPOSAL_FILES = ()
__C.TRAIN.ASPECT_GROUPING = True
__C.TRAIN.GENERATE_PROPOSALS_ON_GPU = False
__C.TRAIN.RPN_POSITIVE_OVERLAP = 0.7
__C.TRAIN.RPN_NEGATIVE_OVERLAP = 0.3
__C.TRAIN.RPN_FG_FRACTION = 0.5
__C.TRAIN.RPN_BATCH_SIZE_PER_IM = 256
__C.TRAIN.RPN_NMS_THRESH = 0.7
__C.TRAIN.RPN_PRE_NMS_TOP_N = 12000  # per FPN level
__C.TRAIN.RPN_POST_NMS_TOP_N = 2000
__C.TRAIN.RPN_STRADDLE_THRESH = 0
__C.TRAIN.RPN_MIN_SIZE = 0
__C.TRAIN.CROWD_FILTER_THRESH = 0.7
__C.TRAIN.GT_MIN_AREA = -1
__C.TRAIN.FREEZE_CONV_BODY = False
__C.TRAIN.AUTO_RESUME = True
# port: the numbered checkpoints (model_iterN.pth) kept, the oldest removed first; 0 = keep all
__C.TRAIN.KEEP_CHECKPOINTS = 0
__C.TRAIN.COPY_WEIGHTS = False
__C.TRAIN.FREEZE_AT = 2
__C.TRAIN.CHECKPOINT_ACTIVATIONS = False  # port: recompute backbone activations to save memory
__C.TRAIN.CUDA_GRAPHS = True  # port: on a GPU, the R-CNN body and RPN head forward + backward, and the RPN targets, training proposals and sampled RoIs (RetinaNet: body and head; CenterNet: backbone and heads) replayed from CUDA graphs (per padded batch shape)
__C.TRAIN.RESIZE_ON_DEVICE = True  # port: on a GPU, R-CNN training images leave the loader workers as uint8 and are mean-subtracted, resized (cv2's linear arithmetic) and padded on the device
__C.TRAIN.CUDA_GRAPHS_MAX_SHAPES = 8  # port: padded batch shapes that get training graphs (each holds its outputs and gradients in GPU memory); the rest run eagerly

# ---------------------------------------------------------------------------------------------
# Data loader
# ---------------------------------------------------------------------------------------------
__C.DATA_LOADER = CfgNode()
__C.DATA_LOADER.NUM_THREADS = 4
__C.DATA_LOADER.MINIBATCH_QUEUE_SIZE = 64
__C.DATA_LOADER.BLOBS_QUEUE_CAPACITY = 8
# port: seconds a loader worker may take to deliver a batch before the run stops naming its images (a stalled
# mount); 0 = wait forever. Only with DATA_LOADER.NUM_THREADS > 0 (the main process cannot time itself out)
__C.DATA_LOADER.TIMEOUT_S = 600

# ---------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------
__C.TEST = CfgNode()
__C.TEST.WEIGHTS = ''
__C.TEST.DATASETS = ()  # tested one after another
# detectron2's TEST.EVAL_PERIOD: during training, every N iterations, test the model on TEST.DATASETS
# (every rank its share) and log its AP (bbox/AP, segm/AP, ...); 0 = off
__C.TEST.EVAL_PERIOD = 0
# port: every N iterations, the model's losses on TEST.DATASETS without gradients (val/loss, ...); 0 = off
__C.TEST.VAL_LOSS_PERIOD = 0
# port: the evaluation metric model_best.pth is chosen by ('bbox/AP', 'segm/AP', 'val/loss', ...; a
# loss is lowest best); '' = the model type's: bbox/AP, CenterNet's val/loss with its VAL_INTERVALS
__C.TEST.BEST_METRIC = ''
__C.TEST.SCALE = 600
__C.TEST.MAX_SIZE = 1000
__C.TEST.NMS = 0.3
__C.TEST.BBOX_REG = True
__C.TEST.PROPOSAL_FILES = ()
__C.TEST.GENERATE_PROPOSALS_ON_GPU = False
__C.TEST.PROPOSAL_LIMIT = 2000
__C.TEST.RPN_NMS_THRESH = 0.7
__C.TEST.RPN_PRE_NMS_TOP_N = 12000
__C.TEST.RPN_POST_NMS_TOP_N = 2000
__C.TEST.RPN_MIN_SIZE = 0
__C.TEST.DETECTIONS_PER_IM = 100
__C.TEST.SCORE_THRESH = 0.05
__C.TEST.COMPETITION_MODE = True
__C.TEST.FORCE_JSON_DATASET_EVAL = False
__C.TEST.PRECOMPUTED_PROPOSALS = True  # inferred: False whenever an RPN is built
__C.TEST.CLASS_SPECIFIC_AR = False
__C.TEST.IMS_PER_BATCH = 1  # port: images per detector call in test_net (CenterNet's configs: 32; R-CNN: 1, as Detectron)
__C.TEST.CUDA_GRAPHS = True  # port: on a GPU, the R-CNN body and RPN head replayed from CUDA graphs (per padded size)
__C.TEST.CUDA_GRAPHS_MAX_SHAPES = 4  # port: padded sizes that get test graphs (each holds its outputs; the pool is shared); the rest run eagerly

__C.TEST.BBOX_AUG = CfgNode()
__C.TEST.BBOX_AUG.ENABLED = False
__C.TEST.BBOX_AUG.SCORE_HEUR = 'UNION'
__C.TEST.BBOX_AUG.COORD_HEUR = 'UNION'
__C.TEST.BBOX_AUG.H_FLIP = False
__C.TEST.BBOX_AUG.SCALES = ()
__C.TEST.BBOX_AUG.MAX_SIZE = 4000
__C.TEST.BBOX_AUG.SCALE_H_FLIP = False
__C.TEST.BBOX_AUG.SCALE_SIZE_DEP = False
__C.TEST.BBOX_AUG.AREA_TH_LO = 50**2
__C.TEST.BBOX_AUG.AREA_TH_HI = 180**2
__C.TEST.BBOX_AUG.ASPECT_RATIOS = ()
__C.TEST.BBOX_AUG.ASPECT_RATIO_H_FLIP = False

__C.TEST.MASK_AUG = CfgNode()
__C.TEST.MASK_AUG.ENABLED = False
__C.TEST.MASK_AUG.HEUR = 'SOFT_AVG'
__C.TEST.MASK_AUG.H_FLIP = False
__C.TEST.MASK_AUG.SCALES = ()
__C.TEST.MASK_AUG.MAX_SIZE = 4000
__C.TEST.MASK_AUG.SCALE_H_FLIP = False
__C.TEST.MASK_AUG.SCALE_SIZE_DEP = False
__C.TEST.MASK_AUG.AREA_TH = 180**2
__C.TEST.MASK_AUG.ASPECT_RATIOS = ()
__C.TEST.MASK_AUG.ASPECT_RATIO_H_FLIP = False

__C.TEST.KPS_AUG = CfgNode()
__C.TEST.KPS_AUG.ENABLED = False
__C.TEST.KPS_AUG.HEUR = 'HM_AVG'
__C.TEST.KPS_AUG.H_FLIP = False
__C.TEST.KPS_AUG.SCALES = ()
__C.TEST.KPS_AUG.MAX_SIZE = 4000
__C.TEST.KPS_AUG.SCALE_H_FLIP = False
__C.TEST.KPS_AUG.SCALE_SIZE_DEP = False
__C.TEST.KPS_AUG.AREA_TH = 180**2
__C.TEST.KPS_AUG.ASPECT_RATIOS = ()
__C.TEST.KPS_AUG.ASPECT_RATIO_H_FLIP = False

__C.TEST.SOFT_NMS = CfgNode()
__C.TEST.SOFT_NMS.ENABLED = False
__C.TEST.SOFT_NMS.METHOD = 'linear'
__C.TEST.SOFT_NMS.SIGMA = 0.5

__C.TEST.BBOX_VOTE = CfgNode()
__C.TEST.BBOX_VOTE.ENABLED = False
__C.TEST.BBOX_VOTE.VOTE_TH = 0.8
__C.TEST.BBOX_VOTE.SCORING_METHOD = 'ID'
__C.TEST.BBOX_VOTE.SCORING_METHOD_BETA = 1.0

# ---------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------
__C.MODEL = CfgNode()
__C.MODEL.TYPE = ''  # 'generalized_rcnn' or 'centernet'
__C.MODEL.CONV_BODY = ''  # e.g. 'FPN.add_fpn_ResNet50_conv5_body'
__C.MODEL.NUM_CLASSES = -1  # including background
__C.MODEL.CLS_AGNOSTIC_BBOX_REG = False
__C.MODEL.BBOX_REG_WEIGHTS = (10., 10., 5., 5.)
__C.MODEL.FASTER_RCNN = False
__C.MODEL.MASK_ON = False
__C.MODEL.KEYPOINTS_ON = False
__C.MODEL.RPN_ONLY = False
__C.MODEL.EXECUTION_TYPE = 'dag'
__C.MODEL.SYNC_BN = False  # port: SyncBatchNorm across DDP ranks for trainable BN layers

__C.RETINANET = CfgNode()
__C.RETINANET.RETINANET_ON = False
__C.RETINANET.ASPECT_RATIOS = (0.5, 1.0, 2.0)
__C.RETINANET.SCALES_PER_OCTAVE = 3
__C.RETINANET.ANCHOR_SCALE = 4
__C.RETINANET.NUM_CONVS = 4
__C.RETINANET.BBOX_REG_WEIGHT = 1.0
__C.RETINANET.BBOX_REG_BETA = 0.11
__C.RETINANET.PRE_NMS_TOP_N = 1000
__C.RETINANET.POSITIVE_OVERLAP = 0.5
__C.RETINANET.NEGATIVE_OVERLAP = 0.4
__C.RETINANET.LOSS_ALPHA = 0.25
__C.RETINANET.LOSS_GAMMA = 2.0
__C.RETINANET.PRIOR_PROB = 0.01
__C.RETINANET.SHARE_CLS_BBOX_TOWER = False
__C.RETINANET.CLASS_SPECIFIC_BBOX = False
__C.RETINANET.SOFTMAX = False
__C.RETINANET.INFERENCE_TH = 0.05

# ---------------------------------------------------------------------------------------------
# Solver
# ---------------------------------------------------------------------------------------------
__C.SOLVER = CfgNode()
__C.SOLVER.OPTIMIZER = 'sgd'  # port: 'sgd' (Detectron's momentum SGD) or 'adam' (CenterNet's)
__C.SOLVER.BASE_LR = 0.001
__C.SOLVER.LR_POLICY = 'step'  # step | steps_with_decay | steps_with_lrs | cosine_decay | exp_decay
__C.SOLVER.GAMMA = 0.1
__C.SOLVER.STEP_SIZE = 30000
__C.SOLVER.STEPS = []
__C.SOLVER.LRS = []
__C.SOLVER.MAX_ITER = 40000  # iterations count global batches, not per-GPU batches
__C.SOLVER.MOMENTUM = 0.9
__C.SOLVER.WEIGHT_DECAY = 0.0005
__C.SOLVER.WEIGHT_DECAY_GN = 0.0
__C.SOLVER.WARM_UP_ITERS = 500
__C.SOLVER.WARM_UP_FACTOR = 1.0 / 3.0
__C.SOLVER.WARM_UP_METHOD = 'linear'
__C.SOLVER.SCALE_MOMENTUM = True
__C.SOLVER.SCALE_MOMENTUM_THRESHOLD = 1.1
__C.SOLVER.LOG_LR_CHANGE_THRESHOLD = 1.1
# port: micro-batches accumulated into one iteration (one optimizer step)
__C.SOLVER.ITER_SIZE = 1
# port: when > 0, the schedule above is the one for this many images per iteration and is
# rescaled by the linear scaling rule to the actual batch (scale_schedule_to_global_batch)
__C.SOLVER.REFERENCE_WORLD_BATCH = 0
# detectron2's gradient clipping: each parameter group of the optimizer clipped on its own, after
# float16 loss scaling is undone; 'value' clamps every element to [-CLIP_VALUE, CLIP_VALUE], 'norm'
# scales the group's NORM_TYPE norm down to at most CLIP_VALUE
__C.SOLVER.CLIP_GRADIENTS = CfgNode()
__C.SOLVER.CLIP_GRADIENTS.ENABLED = False
__C.SOLVER.CLIP_GRADIENTS.CLIP_TYPE = 'value'  # 'value' | 'norm'
__C.SOLVER.CLIP_GRADIENTS.CLIP_VALUE = 1.0
__C.SOLVER.CLIP_GRADIENTS.NORM_TYPE = 2.0

__C.SOLVER.AMP = CfgNode()
__C.SOLVER.AMP.ENABLED = False
__C.SOLVER.AMP.DTYPE = 'float16'  # 'float16' (or 'fp16') | 'bfloat16' (or 'bf16')
__C.SOLVER.AMP.LOSS_SCALE = 0.0  # 0 = dynamic loss scaling

# ---------------------------------------------------------------------------------------------
# Heads and backbones
# ---------------------------------------------------------------------------------------------
__C.FAST_RCNN = CfgNode()
__C.FAST_RCNN.ROI_BOX_HEAD = ''
__C.FAST_RCNN.MLP_HEAD_DIM = 1024
__C.FAST_RCNN.CONV_HEAD_DIM = 256
__C.FAST_RCNN.NUM_STACKED_CONVS = 4
__C.FAST_RCNN.ROI_XFORM_METHOD = 'RoIPoolF'
__C.FAST_RCNN.ROI_XFORM_SAMPLING_RATIO = 0
__C.FAST_RCNN.ROI_XFORM_RESOLUTION = 14

__C.RPN = CfgNode()
__C.RPN.RPN_ON = False  # inferred from MODEL.FASTER_RCNN / MODEL.RPN_ONLY
__C.RPN.SIZES = (64, 128, 256, 512)
__C.RPN.STRIDE = 16
__C.RPN.ASPECT_RATIOS = (0.5, 1, 2)

__C.FPN = CfgNode()
__C.FPN.FPN_ON = False
__C.FPN.DIM = 256
__C.FPN.ZERO_INIT_LATERAL = False
__C.FPN.COARSEST_STRIDE = 32  # images are padded to a multiple of this
__C.FPN.MULTILEVEL_ROIS = False
__C.FPN.ROI_CANONICAL_SCALE = 224
__C.FPN.ROI_CANONICAL_LEVEL = 4
__C.FPN.ROI_MAX_LEVEL = 5
__C.FPN.ROI_MIN_LEVEL = 2
__C.FPN.MULTILEVEL_RPN = False
__C.FPN.RPN_MAX_LEVEL = 6
__C.FPN.RPN_MIN_LEVEL = 2
__C.FPN.RPN_ASPECT_RATIOS = (0.5, 1, 2)
__C.FPN.RPN_ANCHOR_START_SIZE = 32
__C.FPN.EXTRA_CONV_LEVELS = False
__C.FPN.USE_GN = False

__C.MRCNN = CfgNode()
__C.MRCNN.ROI_MASK_HEAD = ''
__C.MRCNN.RESOLUTION = 14
__C.MRCNN.ROI_XFORM_METHOD = 'RoIAlign'
__C.MRCNN.ROI_XFORM_RESOLUTION = 7
__C.MRCNN.ROI_XFORM_SAMPLING_RATIO = 0
__C.MRCNN.DIM_REDUCED = 256
__C.MRCNN.DILATION = 2
__C.MRCNN.UPSAMPLE_RATIO = 1
__C.MRCNN.USE_FC_OUTPUT = False
__C.MRCNN.CONV_INIT = 'GaussianFill'
__C.MRCNN.CLS_SPECIFIC_MASK = True
__C.MRCNN.WEIGHT_LOSS_MASK = 1.0
__C.MRCNN.THRESH_BINARIZE = 0.5

__C.KRCNN = CfgNode()
__C.KRCNN.ROI_KEYPOINTS_HEAD = ''
__C.KRCNN.HEATMAP_SIZE = -1
__C.KRCNN.UP_SCALE = -1
__C.KRCNN.USE_DECONV = False
__C.KRCNN.DECONV_DIM = 256
__C.KRCNN.USE_DECONV_OUTPUT = False
__C.KRCNN.DILATION = 1
__C.KRCNN.DECONV_KERNEL = 4
__C.KRCNN.NUM_KEYPOINTS = -1
__C.KRCNN.NUM_STACKED_CONVS = 8
__C.KRCNN.CONV_HEAD_DIM = 256
__C.KRCNN.CONV_HEAD_KERNEL = 3
__C.KRCNN.CONV_INIT = 'GaussianFill'
__C.KRCNN.NMS_OKS = False
__C.KRCNN.KEYPOINT_CONFIDENCE = 'bbox'
__C.KRCNN.ROI_XFORM_METHOD = 'RoIAlign'
__C.KRCNN.ROI_XFORM_RESOLUTION = 7
__C.KRCNN.ROI_XFORM_SAMPLING_RATIO = 0
__C.KRCNN.MIN_KEYPOINT_COUNT_FOR_VALID_MINIBATCH = 20
__C.KRCNN.INFERENCE_MIN_SIZE = 0
__C.KRCNN.LOSS_WEIGHT = 1.0
__C.KRCNN.NORMALIZE_BY_VISIBLE_KEYPOINTS = True

__C.RFCN = CfgNode()
__C.RFCN.PS_GRID_SIZE = 3

__C.RESNETS = CfgNode()
__C.RESNETS.NUM_GROUPS = 1
__C.RESNETS.WIDTH_PER_GROUP = 64
__C.RESNETS.STRIDE_1X1 = True  # MSRA layout: the stride sits on the first 1x1 conv
__C.RESNETS.TRANS_FUNC = 'bottleneck_transformation'
__C.RESNETS.STEM_FUNC = 'basic_bn_stem'
__C.RESNETS.SHORTCUT_FUNC = 'basic_bn_shortcut'
__C.RESNETS.RES5_DILATION = 1

__C.GROUP_NORM = CfgNode()
__C.GROUP_NORM.DIM_PER_GP = -1
__C.GROUP_NORM.NUM_GROUPS = 32
__C.GROUP_NORM.EPSILON = 1e-5

# ---------------------------------------------------------------------------------------------
# KL-Loss (He et al., CVPR 2019): uncertainty head, XYXY box coding, variance voting
# ---------------------------------------------------------------------------------------------
__C.XYXY = False  # box deltas code the four edges instead of centre/size (RPN and box head)
__C.PRED_STD = False  # add the bbox_pred_std head and the KL loss
__C.PRED_STD_LOG = True  # the head predicts alpha = log(sigma^2)
__C.STD_NMS = False  # test: variance voting + soft-NMS instead of NMS
__C.STD_TH = 0.9
__C.STD = CfgNode()
__C.STD.SOFT = 'soft'  # 'hard' zeroes overlapping scores, anything else decays them (Gaussian)
__C.STD.METHOD = 'stdiou'  # 'stdiou' votes with the predicted sigmas, 'soft' only rescores
__C.STD.IOU_SIGMA = 0.01
# 'reference' applies the sigma columns (x1, x2, y1, y2) positionally to (x1, y1, x2, y2) as
# KL-Loss does (its published AP includes this); 'corrected' pairs each sigma with its coordinate
__C.STD.SIGMA_COLUMN_ORDER = 'reference'

# ---------------------------------------------------------------------------------------------
# CenterNet (Zhou et al., "Objects as Points"), ctdet
# ---------------------------------------------------------------------------------------------
__C.CENTERNET = CfgNode()
__C.CENTERNET.ARCH = 'resdcn_18'
__C.CENTERNET.NUM_CLASSES = 80  # no background class: one heatmap per category
__C.CENTERNET.CAT_SPEC_WH = False
__C.CENTERNET.REG_OFFSET = True
__C.CENTERNET.HEAD_CONV = -1  # -1: 256 for DLA backbones, 64 otherwise
# port: the ResNet archs' three upsampling widths; () = the arch's own (res: 256, 256, 256; resdcn: 256, 128, 64)
__C.CENTERNET.DECONV_FILTERS = ()
__C.CENTERNET.INPUT_RES = 512
__C.CENTERNET.DOWN_RATIO = 4
__C.CENTERNET.MAX_OBJS = 128  # objects per image with targets (the first ones of its annotations)
# Training augmentation (--flip, --not_rand_crop, --scale, --shift, --no_color_aug)
__C.CENTERNET.FLIP = 0.5
__C.CENTERNET.NOT_RAND_CROP = False
__C.CENTERNET.SCALE = 0.4
__C.CENTERNET.SHIFT = 0.1
__C.CENTERNET.NO_COLOR_AUG = False
# port: on a GPU, training and validation images leave the loader workers as the warped uint8 pictures with
# their colour-jitter draws, and the device jitters and normalises them (to float rounding of the workers' numpy)
__C.CENTERNET.NORMALIZE_ON_DEVICE = True
__C.CENTERNET.HM_WEIGHT = 1.0
__C.CENTERNET.WH_WEIGHT = 0.1
__C.CENTERNET.OFF_WEIGHT = 1.0
__C.CENTERNET.K = 100
__C.CENTERNET.FLIP_TEST = False
__C.CENTERNET.TEST_SCALES = (1.0,)
__C.CENTERNET.KEEP_RES = False
__C.CENTERNET.NMS = False  # --nms: soft-NMS per class also at a single test scale
__C.CENTERNET.CUDA_GRAPHS = True  # port: test-time forward + decode replayed from CUDA graphs (per input size)
__C.CENTERNET.NUM_EPOCHS = 140
__C.CENTERNET.LR_STEP = (90, 120)
# CenterNet's --val_intervals: the validation loss every N epochs (TEST.VAL_LOSS_PERIOD) and
# model_best.pth by it; 0 = off (CenterNet's own default is 5)
__C.CENTERNET.VAL_INTERVALS = 0
__C.CENTERNET.LR = 1.25e-4  # the LR for LR_BATCH_SIZE images: SOLVER.BASE_LR = LR x BATCH_SIZE / LR_BATCH_SIZE
__C.CENTERNET.LR_BATCH_SIZE = 32  # CenterNet's --lr default is "for batch size 32" (linear scaling rule)
__C.CENTERNET.BATCH_SIZE = 32  # total over all GPUs
__C.CENTERNET.MASTER_BATCH_SIZE = -1  # -1: BATCH_SIZE // NUM_GPUS on the first GPU
__C.CENTERNET.CHUNK_SIZES = ()  # per-GPU batches; empty: derived from the two keys above
__C.CENTERNET.MEAN = (0.40789654, 0.44719302, 0.47026115)  # BGR, on images scaled to [0, 1]
__C.CENTERNET.STD = (0.28863828, 0.27408164, 0.27809835)

# ---------------------------------------------------------------------------------------------
# Miscellaneous
# ---------------------------------------------------------------------------------------------
__C.NUM_GPUS = 1
# '' (NCCL on GPUs, gloo on CPU), 'nccl' or 'gloo'; gloo on GPUs lets ranks share GPUs (a check mode)
__C.DIST_BACKEND = ''
__C.USE_NCCL = False
__C.DEDUP_BOXES = 1 / 16.
__C.BBOX_XFORM_CLIP = math.log(1000. / 16.)  # upper clamp of dw, dh before exp
__C.BBOX_XFORM_CLIPe = 1000. / 16.  # symmetric clamp of XYXY edge deltas (not a log)
# BGR means subtracted from 0..255 pixels, shaped (1, 1, 3); np.array(cfg.PIXEL_MEANS) gives the array
__C.PIXEL_MEANS = (((102.9801, 115.9465, 122.7717),),)
__C.RNG_SEED = 3
__C.EPS = 1e-14
__C.ROOT_DIR = os.getcwd()
__C.OUTPUT_DIR = '/tmp'
__C.MATLAB = 'matlab'
__C.MEMONGER = True
__C.MEMONGER_SHARE_ACTIVATIONS = False
__C.VIS = False
__C.VIS_TH = 0.9
__C.EXPECTED_RESULTS = []
__C.EXPECTED_RESULTS_RTOL = 0.1
__C.EXPECTED_RESULTS_ATOL = 0.005
__C.EXPECTED_RESULTS_SIGMA_TOL = 4
__C.EXPECTED_RESULTS_EMAIL = ''
__C.DOWNLOAD_CACHE = '/tmp/detectron-download-cache'
__C.CUDNN_BENCHMARK = False  # port: cuDNN autotuning (costs time per new input shape and gave no speed-up: BENCHMARKS.md, "Start-up")
__C.DATASET_CATALOG = ''  # port: a file of custom dataset entries, registered in every process

__C.CLUSTER = CfgNode()
__C.CLUSTER.ON_CLUSTER = False
