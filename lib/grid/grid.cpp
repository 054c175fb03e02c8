// The pure part of the process grid: coordinates, group membership, layout validation.
// No MPI here, so every function is unit-tested directly (tests/test_comm_grid.cpp).
#include "grid/grid.hpp"

#include <sstream>

#include "util/error.hpp"

namespace trident {

namespace {

void check_shape(const GridShape& s) {
  if (s.tp < 1 || s.pp < 1 || s.dp < 1 || s.cp < 1) {
    std::ostringstream m;
    m << "invalid grid shape TP=" << s.tp << " PP=" << s.pp << " DP=" << s.dp;
    if (s.cp != 1) m << " CP=" << s.cp;
    m << ": every dimension must be >= 1";
    throw Error(m.str());
  }
}

void check_rank(const GridShape& s, int rank) {
  check_shape(s);
  if (rank < 0 || rank >= s.world()) {
    std::ostringstream m;
    m << "rank " << rank << " is outside the grid TP*PP*DP = " << s.tp << "*" << s.pp << "*"
      << s.dp;
    if (s.cp != 1) m << " (CP = " << s.cp << ")";
    m << " = " << s.world();
    throw Error(m.str());
  }
}

// The ranks whose coordinates are `c`'s but for the ones `vary` sets, in group-rank order:
// vary(c, i) gives the coordinate of member i.
template <typename Vary>
std::vector<int> group_of(const GridShape& shape, int rank, int size, Vary vary) {
  const GridCoord c = coord_of(shape, rank);
  std::vector<int> g;
  g.reserve(size);
  for (int i = 0; i < size; ++i) g.push_back(rank_of(shape, vary(c, i)));
  return g;
}

}  // namespace

int rank_of(const GridShape& shape, const GridCoord& c) {
  check_shape(shape);
  if (c.tp < 0 || c.tp >= shape.tp || c.pp < 0 || c.pp >= shape.pp || c.dp < 0 ||
      c.dp >= shape.dp || c.cp < 0 || c.cp >= shape.cp) {
    std::ostringstream m;
    m << "grid coordinate (tp=" << c.tp << ", pp=" << c.pp << ", dp=" << c.dp;
    if (shape.cp != 1 || c.cp != 0) m << ", cp=" << c.cp;
    m << ") is outside the grid TP=" << shape.tp << " PP=" << shape.pp << " DP=" << shape.dp;
    if (shape.cp != 1) m << " CP=" << shape.cp;
    throw Error(m.str());
  }
  return ((c.dp * shape.pp + c.pp) * shape.cp + c.cp) * shape.tp + c.tp;
}

GridCoord coord_of(const GridShape& shape, int rank) {
  check_rank(shape, rank);
  GridCoord c;
  c.tp = rank % shape.tp;
  c.cp = (rank / shape.tp) % shape.cp;
  c.pp = (rank / (shape.tp * shape.cp)) % shape.pp;
  c.dp = rank / (shape.tp * shape.cp * shape.pp);
  return c;
}

std::vector<int> tensor_group(const GridShape& shape, int rank) {
  return group_of(shape, rank, shape.tp, [](GridCoord c, int i) { c.tp = i; return c; });
}

std::vector<int> context_group(const GridShape& shape, int rank) {
  return group_of(shape, rank, shape.cp, [](GridCoord c, int i) { c.cp = i; return c; });
}

std::vector<int> pipeline_group(const GridShape& shape, int rank) {
  return group_of(shape, rank, shape.pp, [](GridCoord c, int i) { c.pp = i; return c; });
}

std::vector<int> data_group(const GridShape& shape, int rank) {
  return group_of(shape, rank, shape.dp, [](GridCoord c, int i) { c.dp = i; return c; });
}

std::vector<int> model_group(const GridShape& shape, int rank) {
  // Group-rank order = pp * TP + tp: under CP = 1 the contiguous block of one data replica.
  const int tp = shape.tp;
  return group_of(shape, rank, shape.tp * shape.pp, [tp](GridCoord c, int i) {
    c.pp = i / tp;
    c.tp = i % tp;
    return c;
  });
}

std::vector<int> grad_reduce_group(const GridShape& shape, int rank) {
  const int cp = shape.cp;
  return group_of(shape, rank, shape.dp * shape.cp, [cp](GridCoord c, int i) {
    c.dp = i / cp;
    c.cp = i % cp;
    return c;
  });
}

std::vector<int> embedding_group(const GridShape& shape, int rank) {
  // For a middle-stage rank this is the embedding group of its (tp, cp, dp) column, which does
  // not contain `rank` itself: such a rank is not a member (ProcessGrid gives it no
  // communicator).
  const int last = shape.pp - 1;
  return group_of(shape, rank, shape.pp > 1 ? 2 : 1, [last](GridCoord c, int i) {
    c.pp = i == 0 ? 0 : last;
    return c;
  });
}

namespace {

void check_expert(const GridShape& shape, int ep) {
  if (ep < 1 || shape.dp % ep != 0) {
    std::ostringstream m;
    m << "parallel.expert (" << ep << ") must divide parallel.data (" << shape.dp << ")";
    throw Error(m.str());
  }
}

}  // namespace

std::vector<int> expert_group(const GridShape& shape, int ep, int rank) {
  check_expert(shape, ep);
  const int first = coord_of(shape, rank).dp / ep * ep;
  return group_of(shape, rank, ep, [first](GridCoord c, int i) { c.dp = first + i; return c; });
}

std::vector<int> expert_data_group(const GridShape& shape, int ep, int rank) {
  check_expert(shape, ep);
  // Every context rank of those replicas too: an expert's gradient sums the tokens of every
  // rank that routes to it, and under context parallelism those are data x context.
  const int cp = shape.cp;
  return group_of(shape, rank, shape.dp / ep * cp, [ep, cp](GridCoord c, int i) {
    c.dp = c.dp % ep + i / cp * ep;
    c.cp = i % cp;
    return c;
  });
}

int64_t padded_vocab(int64_t vocab_size, int64_t vocab_multiple, int64_t tp) {
  if (vocab_size < 1 || vocab_multiple < 1 || tp < 1) {
    std::ostringstream m;
    m << "cannot pad the vocabulary: model.vocab_size = " << vocab_size
      << ", model.vocab_multiple = " << vocab_multiple << ", parallel.tensor = " << tp
      << " (all must be >= 1)";
    throw Error(m.str());
  }
  const int64_t block = vocab_multiple * tp;
  return (vocab_size + block - 1) / block * block;
}

void validate_layout(const GridShape& shape, int world_size, int ranks_per_node,
                     const ModelConfig& model) {
  auto fail = [](const std::ostringstream& m) { throw Error(m.str()); };
  if (shape.tp < 1 || shape.pp < 1 || shape.dp < 1 || shape.cp < 1) {
    std::ostringstream m;
    if (shape.cp == 1)
      m << "parallel.tensor, parallel.pipeline and parallel.data must be >= 1 (got " << shape.tp
        << ", " << shape.pp << ", " << shape.dp << ")";
    else
      m << "parallel.tensor, parallel.context, parallel.pipeline and parallel.data must be >= 1 "
           "(got "
        << shape.tp << ", " << shape.cp << ", " << shape.pp << ", " << shape.dp << ")";
    fail(m);
  }
  const int64_t chunks = 2 * static_cast<int64_t>(shape.cp);
  if (shape.cp > 1 && model.seq_len % chunks != 0) {
    std::ostringstream m;
    m << "model.seq_len = " << model.seq_len << " is not divisible by 2 * parallel.context = "
      << chunks << " (each sequence is cut into 2 * context equal chunks)";
    fail(m);
  }
  check_expert(shape, shape.ep);
  if (model.moe_experts > 0 && model.moe_experts % shape.ep != 0) {
    std::ostringstream m;
    m << "model.moe_experts (" << model.moe_experts << ") must be divisible by parallel.expert ("
      << shape.ep << ")";
    fail(m);
  }
  if (static_cast<int64_t>(shape.tp) * shape.cp * shape.pp * shape.dp != world_size) {
    std::ostringstream m;
    if (shape.cp == 1)
      m << "parallel.tensor * parallel.pipeline * parallel.data = " << shape.tp << "*"
        << shape.pp << "*" << shape.dp;
    else
      m << "parallel.tensor * parallel.context * parallel.pipeline * parallel.data = "
        << shape.tp << "*" << shape.cp << "*" << shape.pp << "*" << shape.dp;
    m << " = " << static_cast<int64_t>(shape.tp) * shape.cp * shape.pp * shape.dp
      << " but the job has " << world_size << " ranks";
    fail(m);
  }
  if (model.heads < 1 || model.width < 1 || model.layers < 1) {
    std::ostringstream m;
    m << "model.heads = " << model.heads << ", model.width = " << model.width
      << " and model.layers = " << model.layers << " must all be >= 1";
    fail(m);
  }
  if (model.heads % shape.tp != 0) {
    std::ostringstream m;
    m << "model.heads = " << model.heads << " is not divisible by parallel.tensor = " << shape.tp
      << " (each tensor rank holds heads/TP whole attention heads)";
    fail(m);
  }
  // kv_heads = 0 means heads (checked above), so this fires for an explicit kv_heads only.
  if (model.kv_head_count() % shape.tp != 0) {
    std::ostringstream m;
    m << "model.kv_heads = " << model.kv_head_count()
      << " is not divisible by parallel.tensor = " << shape.tp
      << " (each tensor rank holds kv_heads/TP whole key/value heads)";
    fail(m);
  }
  if (model.width % shape.tp != 0) {
    std::ostringstream m;
    m << "model.width = " << model.width << " is not divisible by parallel.tensor = " << shape.tp;
    fail(m);
  }
  if (model.ffn_size() % shape.tp != 0) {
    std::ostringstream m;
    m << "the MLP size " << model.ffn_size()
      << (model.ffn_width > 0 ? " (model.ffn_width)"
                              : " (model.ffn_width = 0: the default for model.arch = " +
                                    model.arch + ")")
      << " is not divisible by parallel.tensor = " << shape.tp;
    fail(m);
  }
  if (ranks_per_node > 0 && ranks_per_node % shape.tp != 0) {
    std::ostringstream m;
    m << "parallel.tensor = " << shape.tp << " does not divide the " << ranks_per_node
      << " ranks per node: a tensor-parallel group must not cross a node";
    fail(m);
  }
  if (shape.pp > model.layers) {
    std::ostringstream m;
    m << "parallel.pipeline = " << shape.pp << " is more than model.layers = " << model.layers
      << ": every pipeline stage needs at least one layer";
    fail(m);
  }
  if (model.vocab_size < 1 || model.vocab_multiple < 1) {
    std::ostringstream m;
    m << "cannot pad the vocabulary: model.vocab_size = " << model.vocab_size
      << " and model.vocab_multiple = " << model.vocab_multiple << " must both be >= 1";
    fail(m);
  }
  // Every tensor rank must own at least one row of the padded vocabulary. With the padding
  // rule this always holds once the values above are positive; kept as the stated invariant.
  if (padded_vocab(model.vocab_size, model.vocab_multiple, shape.tp) / shape.tp < 1) {
    std::ostringstream m;
    m << "padded vocabulary of model.vocab_size = " << model.vocab_size
      << " gives no row to each of parallel.tensor = " << shape.tp << " ranks";
    fail(m);
  }
}

}  // namespace trident
