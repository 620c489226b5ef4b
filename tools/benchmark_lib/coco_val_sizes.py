"""(height, width, images) of the 80 images of coco_tiny val (80 COCO val2017 images), most frequent first.

Written by:
    python tools/benchmark_lib/image_sizes.py instances_val2017.json 'coco_tiny val (80 COCO val2017 images)' > tools/benchmark_lib/coco_val_sizes.py
"""
SOURCE = 'coco_tiny val (80 COCO val2017 images)'
SIZES = [
    (480, 640, 20),
    (427, 640, 11),
    (426, 640, 7),
    (640, 480, 6),
    (428, 640, 4),
    (375, 500, 3),
    (333, 500, 2),
    (640, 425, 2),
    (640, 426, 2),
    (640, 428, 2),
    (240, 320, 1),
    (320, 640, 1),
    (332, 500, 1),
    (334, 500, 1),
    (357, 500, 1),
    (368, 640, 1),
    (370, 500, 1),
    (374, 500, 1),
    (424, 640, 1),
    (425, 640, 1),
    (429, 640, 1),
    (444, 640, 1),
    (449, 640, 1),
    (461, 614, 1),
    (464, 640, 1),
    (479, 640, 1),
    (486, 500, 1),
    (500, 375, 1),
    (640, 358, 1),
    (640, 460, 1),
    (640, 478, 1),
]
