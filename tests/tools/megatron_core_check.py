#!/usr/bin/env python3
"""By hand, not in CTest (needs torch and megatron-core): reads a .bin/.idx pair written by
data_tools/prepare_text.py with Megatron-LM's own IndexedDataset, writes the same documents
again with Megatron's own IndexedDatasetBuilder (dtype from DType.optimal_dtype(VOCAB), one
sequence per document, as tools/preprocess_data.py does) and compares the files byte for byte.

  pip install --no-deps --target /tmp/mcore megatron-core      # into any dir, e.g.
  PYTHONPATH=/tmp/mcore /work/hfref_venv/bin/python tests/tools/megatron_core_check.py \\
      data/fortunes_bpe/train 4096 [TOKENIZER_JSON]

Exit status 0 when both files are identical.
"""
import filecmp
import os
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")  # megatron-core warns about Transformer Engine and Apex

import numpy  # noqa: E402
import torch  # noqa: E402
from megatron.core.datasets.indexed_dataset import (  # noqa: E402
    DType, IndexedDataset, IndexedDatasetBuilder)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    prefix, vocab = sys.argv[1], int(sys.argv[2])
    ds = IndexedDataset(prefix)
    docs = len(ds.document_indices) - 1
    print(f"{prefix}: Megatron's IndexedDataset reads {len(ds)} sequences, {docs} documents, "
          f"dtype {ds.index.dtype.__name__}, {int(ds.sequence_lengths.sum())} tokens")
    print(f"document 0: {[int(t) for t in ds[0][:16]]} ...")
    if len(sys.argv) == 4:
        from tokenizers import Tokenizer
        text = Tokenizer.from_file(sys.argv[3]).decode([int(t) for t in ds[0]],
                                                       skip_special_tokens=False)
        print(f"document 0 decoded: {text[:100]!r}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "megatron")
        builder = IndexedDatasetBuilder(out + ".bin", dtype=DType.optimal_dtype(vocab))
        for i in range(len(ds)):
            ids = torch.tensor(ds[i].astype(numpy.int64))
            builder.add_document(ids, [len(ids)])
        builder.finalize(out + ".idx")
        same = all(filecmp.cmp(prefix + ext, out + ext, shallow=False) for ext in (".bin", ".idx"))
    print(f"rewritten by Megatron's IndexedDatasetBuilder "
          f"({DType.optimal_dtype(vocab).__name__}): .bin and .idx "
          + ("identical" if same else "DIFFER"))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
