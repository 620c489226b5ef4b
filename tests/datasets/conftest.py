import json

import pytest

from detectron.datasets import dataset_catalog


@pytest.fixture
def register_coco(tmp_path, monkeypatch):
    """register_coco(name, coco_dict) -> JSON file + empty image files registered under name.

    Registrations are private to the test.
    """
    monkeypatch.setattr(dataset_catalog, '_registered', {})

    def register(name, coco):
        root = tmp_path / name
        image_dir = root / 'images'
        image_dir.mkdir(parents=True)
        for image in coco['images']:
            (image_dir / image['file_name']).write_bytes(b'')
        ann_file = root / 'annotations.json'
        ann_file.write_text(json.dumps(coco))
        dataset_catalog.register_dataset(name, str(image_dir), str(ann_file))
        return root

    return register
