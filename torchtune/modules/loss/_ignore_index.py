"""The label the losses leave out: prompt tokens (``train_on_input=False``), padding and the first token of each
packed segment carry it. -100 is also ``F.cross_entropy``'s default ``ignore_index``. Datasets, collate functions
and recipes import it from ``torchtune.modules.loss`` (or ``torchtune.data``)."""

CROSS_ENTROPY_IGNORE_IDX = -100
