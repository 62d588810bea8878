// Paged decode attention for the CPU: each decode reads its keys and values
// in place, through its block table, with no gather copy.
//
//   out[b, h] = softmax_t(scale * q[b, h] . K[t, h / g]) @ V[., h / g]
//
// over the seq_lens[b] cached tokens of request b, token t living in block
// block_tables[b][t / block_size] at row t % block_size. One token's K (or V)
// for every KV head is one contiguous row of Hkv x D numbers, so a request
// streams through its blocks front to back and each byte is read once.
// Requests run in parallel; each keeps its [Hq, L] scores (a few hundred KB).
// vLLM's CPU backend has a kernel of the same shape (csrc/cpu/attention.cpp,
// paged_attention_v1_impl: scores block by block through the table, a
// softmax, the weighted values), vectorised by hand over its own cache layout.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

template <typename T>
void decode_rows(const T* q, const T* k, const T* v, const int64_t* tables, const int64_t* lens,
                 T* out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int64_t block_size, int64_t table_width, T scale) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t row = num_kv_heads * head_dim;
  at::parallel_for(0, num_seqs, 1, [&](int64_t begin, int64_t end) {
    std::vector<T> scores, acc(num_heads * head_dim), total(num_heads);
    for (int64_t b = begin; b < end; ++b) {
      const int64_t len = lens[b];
      const int64_t* table = tables + b * table_width;
      const T* qb = q + b * num_heads * head_dim;
      scores.resize(num_heads * len);                     // [Hq, L]: one head's scores contiguous
      // Pass 1: every score, token by token; a token's K row holds every KV head.
      for (int64_t t = 0; t < len; ++t) {
        const T* kt = k + (table[t / block_size] * block_size + t % block_size) * row;
        for (int64_t h = 0; h < num_heads; ++h) {
          const T* kh = kt + (h / group) * head_dim;
          const T* qh = qb + h * head_dim;
          T dot = 0;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kh[d];
          scores[h * len + t] = dot * scale;
        }
      }
      // Softmax of each head over its tokens. A head's scores are contiguous, so
      // the exp runs 8 or 16 at a time (glibc's vector exp, which -ffast-math
      // lets the compiler call; the kernel ran 25-30% faster for it on GQA
      // shapes). The max starts from a real score: fast-math assumes no infinities.
      for (int64_t h = 0; h < num_heads; ++h) {
        T* sh = scores.data() + h * len;
        T top = sh[0];
#pragma omp simd reduction(max : top)
        for (int64_t t = 0; t < len; ++t) top = std::max(top, sh[t]);
        T sum = 0;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < len; ++t) {
          sh[t] = std::exp(sh[t] - top);
          sum += sh[t];
        }
        total[h] = sum;
      }
      // Pass 2: the probability-weighted sum of the values.
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t t = 0; t < len; ++t) {
        const T* vt = v + (table[t / block_size] * block_size + t % block_size) * row;
        for (int64_t h = 0; h < num_heads; ++h) {
          const T* vh = vt + (h / group) * head_dim;
          T* ah = acc.data() + h * head_dim;
          const T p = scores[h * len + t];
#pragma omp simd
          for (int64_t d = 0; d < head_dim; ++d) ah[d] += p * vh[d];
        }
      }
      T* ob = out + b * num_heads * head_dim;
      for (int64_t h = 0; h < num_heads; ++h)
        for (int64_t d = 0; d < head_dim; ++d) ob[h * head_dim + d] = acc[h * head_dim + d] / total[h];
    }
  });
}

at::Tensor paged_decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale) {
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "q [B, Hq, D], k_cache and v_cache [blocks, block_size, Hkv, D]");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous(),
              "q and the caches must be contiguous");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "q and the caches must have one dtype");
  TORCH_CHECK(block_tables.scalar_type() == at::kLong && seq_lens.scalar_type() == at::kLong,
              "block_tables and seq_lens must be int64");
  const int64_t num_seqs = q.size(0), num_heads = q.size(1), head_dim = q.size(2);
  const int64_t block_size = k_cache.size(1), num_kv_heads = k_cache.size(2);
  TORCH_CHECK(k_cache.size(3) == head_dim && num_heads % num_kv_heads == 0, "head shapes do not match");
  TORCH_CHECK(block_tables.dim() == 2 && block_tables.size(0) == num_seqs && seq_lens.numel() == num_seqs,
              "one block table and one length per request");
  auto tables = block_tables.contiguous();
  auto lens = seq_lens.contiguous();
  // A wrong table entry or length would read outside the cache: refuse it.
  const int64_t num_blocks = k_cache.size(0), width = tables.size(1);
  const int64_t* table_data = tables.data_ptr<int64_t>();
  const int64_t* len_data = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < num_seqs; ++b) {
    TORCH_CHECK(len_data[b] >= 1 && len_data[b] <= width * block_size, "seq_lens[", b, "]=", len_data[b],
                ": must be in [1, ", width * block_size, "]");
    for (int64_t j = 0; j < (len_data[b] + block_size - 1) / block_size; ++j)
      TORCH_CHECK(table_data[b * width + j] >= 0 && table_data[b * width + j] < num_blocks, "block_tables[",
                  b, "][", j, "]=", table_data[b * width + j], ": must be in [0, ", num_blocks, ")");
  }
  auto out = at::empty_like(q);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "paged_decode", [&] {
    decode_rows<scalar_t>(q.data_ptr<scalar_t>(), k_cache.data_ptr<scalar_t>(), v_cache.data_ptr<scalar_t>(),
                          tables.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), out.data_ptr<scalar_t>(),
                          num_seqs, num_heads, num_kv_heads, head_dim, block_size, tables.size(1),
                          static_cast<scalar_t>(scale));
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(minillm, m) {
  m.def("paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, Tensor seq_lens, "
        "float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(minillm, CPU, m) { m.impl("paged_decode", &paged_decode); }
