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
// Pass 1 takes 16 tokens at a time; on AVX-512 their float dot products are
// summed together (sum_each), elsewhere the compiler vectorises each one.
// vLLM's CPU backend had a kernel of the same shape (csrc/cpu/attention.cpp,
// paged_attention_v1_impl: scores block by block through the table, a
// softmax, the weighted values), vectorised by hand over its own cache layout;
// since its PR #27954 one kernel, csrc/cpu/cpu_attn.cpp, serves decodes and
// chunked prefills alike through the block table.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cmath>
#include <vector>

namespace {

constexpr int64_t kGroup = 16;   // tokens scored together: one AVX-512 register of float scores

// Where each of n consecutive tokens, from `first`, sits in the pool: one row
// pointer per token, walking the block table without a division per token.
template <typename T>
void token_rows(const T* pool, const int64_t* table, int64_t block_size, int64_t row, int64_t first,
                int64_t n, const T** rows) {
  int64_t block = first / block_size, offset = first % block_size;
  for (int64_t i = 0; i < n; ++i) {
    rows[i] = pool + (table[block] * block_size + offset) * row;
    if (++offset == block_size) offset = 0, ++block;
  }
}

// Pass 1 for n <= 16 tokens: scores[h * len + i] = scale * q[h] . K[i, h / g],
// one dot product at a time.
template <typename T>
void score_tokens_plain(const T* q, const T* const* keys, int64_t n, int64_t num_heads, int64_t group,
                        int64_t head_dim, T scale, T* scores, int64_t len) {
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < num_heads; ++h) {
      const T* kh = keys[i] + (h / group) * head_dim;
      const T* qh = q + h * head_dim;
      T dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t d = 0; d < head_dim; ++d) dot += qh[d] * kh[d];
      scores[h * len + i] = dot * scale;
    }
}

template <typename T>
void score_tokens(const T* q, const T* const* keys, int64_t n, int64_t num_heads, int64_t group,
                  int64_t head_dim, T scale, T* scores, int64_t len) {
  score_tokens_plain(q, keys, n, num_heads, group, head_dim, scale, scores, len);
}

#if defined(__AVX512F__)
// The sum of each of 16 registers, as the 16 lanes of one register: add them
// in pairs while transposing (45 instructions for 16 sums; reducing each
// register alone takes 8 or so, one after another). Reducing every dot product
// alone is what held pass 1 back on GQA shapes, where each key row serves
// several query heads.
inline __m512 sum_each(const __m512 v[16]) {
  __m512 w[8], x[4];
  for (int k = 0; k < 8; ++k)   // per 128-bit lane: a0+a2 b0+b2 a1+a3 b1+b3
    w[k] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * k], v[2 * k + 1]), _mm512_unpackhi_ps(v[2 * k], v[2 * k + 1]));
  for (int k = 0; k < 4; ++k) { // per 128-bit lane: a partial sum of each of tokens 4k..4k+3
    const __m512d c = _mm512_castps_pd(w[2 * k]), d = _mm512_castps_pd(w[2 * k + 1]);
    x[k] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(c, d)), _mm512_castpd_ps(_mm512_unpackhi_pd(c, d)));
  }
  // Add the four 128-bit lanes: even lanes + odd lanes, twice.
  const __m512 z0 = _mm512_add_ps(_mm512_shuffle_f32x4(x[0], x[1], 0x88), _mm512_shuffle_f32x4(x[0], x[1], 0xDD));
  const __m512 z1 = _mm512_add_ps(_mm512_shuffle_f32x4(x[2], x[3], 0x88), _mm512_shuffle_f32x4(x[2], x[3], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z0, z1, 0x88), _mm512_shuffle_f32x4(z0, z1, 0xDD));
}

// float on AVX-512: 16 tokens' dot products side by side, one register each,
// summed together by sum_each.
template <>
void score_tokens<float>(const float* q, const float* const* keys, int64_t n, int64_t num_heads, int64_t group,
                         int64_t head_dim, float scale, float* scores, int64_t len) {
  if (head_dim % 16 != 0) return score_tokens_plain(q, keys, n, num_heads, group, head_dim, scale, scores, len);
  // Every loop over the 16 tokens is unrolled, so the 16 running sums live in
  // registers; a short group repeats its first row and stores n sums only.
  const float* rows[16];
  for (int i = 0; i < 16; ++i) rows[i] = keys[i < n ? i : 0];
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1);
  for (int64_t h = 0; h < num_heads; ++h) {
    const float* qh = q + h * head_dim;
    const int64_t kv_offset = (h / group) * head_dim;
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < head_dim; d += 16) {
      const __m512 qd = _mm512_loadu_ps(qh + d);
#pragma GCC unroll 16
      for (int i = 0; i < 16; ++i) acc[i] = _mm512_fmadd_ps(qd, _mm512_loadu_ps(rows[i] + kv_offset + d), acc[i]);
    }
    _mm512_mask_storeu_ps(scores + h * len, valid, _mm512_mul_ps(sum_each(acc), _mm512_set1_ps(scale)));
  }
}
#endif

// Pass 2 for the n tokens of one block: acc += p[i] * v[i * row], the rows of
// one KV head. With head_dim known at compile time the running sums stay in
// registers over the block, two of them so that each add need not wait for
// the one before; other sizes take the plain loop. Rows are addressed by a
// stride, not a pointer each: given pointers, GCC 12 jammed the token loop
// into the dimension loop and left all but one token scalar.
template <typename T, int D>
void add_values_fixed(const T* p, const T* v, int64_t n, int64_t row, T* acc) {
  T even[D], odd[D];
  for (int d = 0; d < D; ++d) even[d] = acc[d], odd[d] = 0;
  int64_t i = 0;
  for (; i + 1 < n; i += 2) {
    const T p0 = p[i], p1 = p[i + 1];
    const T* v0 = v + i * row;
    const T* v1 = v0 + row;
#pragma omp simd
    for (int d = 0; d < D; ++d) {
      even[d] += p0 * v0[d];
      odd[d] += p1 * v1[d];
    }
  }
  if (i < n) {
    const T pi = p[i];
    const T* vi = v + i * row;
#pragma omp simd
    for (int d = 0; d < D; ++d) even[d] += pi * vi[d];
  }
  for (int d = 0; d < D; ++d) acc[d] = even[d] + odd[d];
}

template <typename T>
void add_values(const T* p, const T* v, int64_t n, int64_t row, int64_t head_dim, T* acc) {
  switch (head_dim) {
    case 32: return add_values_fixed<T, 32>(p, v, n, row, acc);
    case 64: return add_values_fixed<T, 64>(p, v, n, row, acc);
    case 128: return add_values_fixed<T, 128>(p, v, n, row, acc);
  }
  for (int64_t i = 0; i < n; ++i) {
    const T pi = p[i];
    const T* vi = v + i * row;
#pragma omp simd
    for (int64_t d = 0; d < head_dim; ++d) acc[d] += pi * vi[d];
  }
}

// Where to cut [0, num_seqs) into `parts` runs of requests holding about the
// same number of cached tokens, the work of a decode. Cut by count instead,
// a batch with lengths from 100 to 1,000 in order gave one thread twice the
// other's work, and the kernel took as long as that thread.
std::vector<int64_t> cuts_by_length(const int64_t* lens, int64_t num_seqs, int64_t parts) {
  int64_t total = 0;
  for (int64_t b = 0; b < num_seqs; ++b) total += lens[b];
  std::vector<int64_t> cuts(parts + 1, num_seqs);
  cuts[0] = 0;
  int64_t done = 0, b = 0;
  for (int64_t p = 1; p < parts; ++p) {
    while (b < num_seqs && done * parts < total * p) done += lens[b++];
    cuts[p] = b;
  }
  return cuts;
}

template <typename T>
void decode_rows(const T* q, const T* k, const T* v, const int64_t* tables, const int64_t* lens,
                 T* out, int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                 int64_t block_size, int64_t table_width, T scale) {
  const int64_t group = num_heads / num_kv_heads;
  const int64_t row = num_kv_heads * head_dim;
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), num_seqs));
  const std::vector<int64_t> cuts = cuts_by_length(lens, num_seqs, parts);
  at::parallel_for(0, parts, 1, [&](int64_t first_part, int64_t end_part) {
    std::vector<T> scores, acc(num_heads * head_dim), total(num_heads);
    const T* rows[kGroup];
    for (int64_t b = cuts[first_part]; b < cuts[end_part]; ++b) {
      const int64_t len = lens[b];
      const int64_t* table = tables + b * table_width;
      const T* qb = q + b * num_heads * head_dim;
      scores.resize(num_heads * len);                     // [Hq, L]: one head's scores contiguous
      // Pass 1: every score, 16 tokens at a time; a token's K row holds every KV head.
      for (int64_t t = 0; t < len; t += kGroup) {
        const int64_t n = std::min(kGroup, len - t);
        token_rows(k, table, block_size, row, t, n, rows);
        score_tokens(qb, rows, n, num_heads, group, head_dim, scale, scores.data() + t, len);
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
      // Pass 2: the probability-weighted sum of the values, block by block.
      std::fill(acc.begin(), acc.end(), T(0));
      for (int64_t t = 0; t < len; t += block_size) {
        const T* block = v + table[t / block_size] * block_size * row;
        const int64_t n = std::min(block_size, len - t);
        for (int64_t h = 0; h < num_heads; ++h)
          add_values(scores.data() + h * len + t, block + (h / group) * head_dim, n, row, head_dim,
                     acc.data() + h * head_dim);
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
