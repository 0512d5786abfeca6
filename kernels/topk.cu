// Top-k selection by |x| (for the top-k codec) and the sparse scatters that go with it.
//
// Exact and deterministic without sorting all n values:
//  1. a strided sample of |x| estimates a threshold T that at least k values reach;
//  2. the candidates (|x| >= T, in index order) are copied out, one pass over x
//     (if the estimate was too high, every index is a candidate);
//  3. the k-th largest |x| among the candidates is found by binary search over its bits
//     (31 counting passes over the candidates, typically ~1.3 k of them);
//  4. the result is every candidate above it plus the lowest-index ties, in index order.
// |x| is compared as the bit pattern of x with the sign cleared: an order on finite values
// that puts +-Inf above them and NaN above Inf.
#include <thrust/copy.h>
#include <thrust/count.h>
#include <thrust/functional.h>
#include <thrust/sequence.h>
#include <thrust/sort.h>
#include <thrust/transform.h>

#include "kernels/common.cuh"

namespace ps::PS_KERNELS_NS {
namespace {

using detail::float_bits;

struct abs_key {
  const float* x;
  PS_HD std::uint32_t operator()(std::size_t i) const { return float_bits(x[i]) & 0x7fffffffu; }
};

struct strided_key {
  const float* x;
  std::size_t stride;
  PS_HD std::uint32_t operator()(std::size_t j) const {
    return float_bits(x[j * stride]) & 0x7fffffffu;
  }
};

struct index_at_least {
  const float* x;
  std::uint32_t t;
  PS_HD bool operator()(std::uint32_t i) const { return (float_bits(x[i]) & 0x7fffffffu) >= t; }
};

struct at_least {
  std::uint32_t t;
  PS_HD bool operator()(std::uint32_t key) const { return key >= t; }
};

struct above {
  std::uint32_t t;
  PS_HD bool operator()(std::uint32_t key) const { return key > t; }
};

// Stencil over candidate positions j: key[j] == thr.
struct tie_at {
  const std::uint32_t* key;
  std::uint32_t thr;
  PS_HD bool operator()(std::size_t j) const { return key[j] == thr; }
};

// Keeps candidate j when its key is above thr, or a tie at or before the cut position.
struct keep {
  const std::uint32_t* key;
  std::uint32_t thr;
  std::size_t cut;
  PS_HD bool operator()(std::size_t j) const {
    return key[j] > thr || (key[j] == thr && j <= cut);
  }
};

struct gather_value {
  const float* x;
  const std::uint32_t* idx;
  float* val;
  PS_HD void operator()(std::size_t j) const { val[j] = x[idx[j]]; }
};

struct zero_at {
  float* x;
  const std::uint32_t* idx;
  PS_HD void operator()(std::size_t j) const { x[idx[j]] = 0.0f; }
};

struct scatter_at {
  float* x;
  const std::uint32_t* idx;
  const float* val;
  bool add;
  PS_HD void operator()(std::size_t j) const {
    if (add)
      x[idx[j]] += val[j];
    else
      x[idx[j]] = val[j];
  }
};

// A key threshold from a strided sample of x, with a margin so that usually >= k keys
// pass, and in c how many do; 0 (and c = n) when the sample gives none or too few pass.
std::uint32_t candidate_threshold(const float* x, std::size_t n, std::size_t k, std::size_t& c) {
  using detail::raw;
  using detail::with_policy;
  const std::size_t samples = n < 65536 ? n : 65536, stride = n / samples;
  detail::temp_vector<std::uint32_t> sample(samples);
  std::uint32_t* sp = raw(sample);
  with_policy(samples, [&](auto policy) {
    thrust::transform(policy, thrust::counting_iterator<std::size_t>(0),
                      thrust::counting_iterator<std::size_t>(samples), sp, strided_key{x, stride});
    thrust::sort(policy, sp, sp + samples, thrust::greater<std::uint32_t>());
    return 0;
  });
  const double expected = static_cast<double>(k) * static_cast<double>(samples) / static_cast<double>(n);
  const std::size_t pos = static_cast<std::size_t>(expected * 1.25) + 32;
  std::uint32_t t = pos < samples ? static_cast<std::uint32_t>(sample[pos]) : 0u;
  c = n;
  if (t == 0) return 0;
  thrust::counting_iterator<std::uint32_t> first(0);
  c = static_cast<std::size_t>(with_policy(n, [&](auto policy) {
    return thrust::count_if(policy, first, first + n, index_at_least{x, t});
  }));
  if (c >= k) return t;
  c = n;
  return 0;
}

}  // namespace

std::size_t topk_select(const float* x, std::size_t n, std::size_t k, std::uint32_t* idx,
                        float* val) {
  using detail::raw;
  using detail::with_policy;
  if (k > n) k = n;
  if (k == 0) return 0;
  thrust::counting_iterator<std::uint32_t> first(0);
  if (k == n) {
    with_policy(n, [&](auto policy) { thrust::sequence(policy, idx, idx + n, std::uint32_t{0}); return 0; });
    detail::for_each_index(n, gather_value{x, idx, val});
    return n;
  }

  // 1. Threshold estimate from a strided sample, with a margin so that usually >= k pass.
  std::size_t c = n;
  const std::uint32_t t = candidate_threshold(x, n, k, c);

  // 2. Candidates in index order, and their keys.
  detail::temp_vector<std::uint32_t> cand(c), key(c);
  std::uint32_t *cp = raw(cand), *kp = raw(key);
  with_policy(n, [&](auto policy) {
    if (t > 0)
      thrust::copy_if(policy, first, first + n, cp, index_at_least{x, t});
    else
      thrust::sequence(policy, cp, cp + c, std::uint32_t{0});
    thrust::transform(policy, cp, cp + c, kp, abs_key{x});
    return 0;
  });

  // 3. thr = the largest value with count(key >= thr) >= k, i.e. the k-th largest key.
  std::uint32_t thr = 0;
  std::size_t gt = 0, cut = 0;
  with_policy(c, [&](auto policy) {
    for (int bit = 30; bit >= 0; --bit) {
      const std::uint32_t trial = thr | (1u << bit);
      if (static_cast<std::size_t>(thrust::count_if(policy, kp, kp + c, at_least{trial})) >= k) thr = trial;
    }
    // 4. Everything above thr, plus the first `need` ties in index order.
    gt = static_cast<std::size_t>(thrust::count_if(policy, kp, kp + c, above{thr}));
    const std::size_t need = k - gt;  // >= 1
    thrust::counting_iterator<std::size_t> pos0(0);
    detail::temp_vector<std::size_t> ties(c - gt);
    thrust::copy_if(policy, pos0, pos0 + c, raw(ties), tie_at{kp, thr});
    cut = ties[need - 1];
    return 0;
  });
  thrust::counting_iterator<std::size_t> pos0(0);
  auto kept = with_policy(c, [&](auto policy) {
    return thrust::copy_if(policy, cp, cp + c, pos0, idx, keep{kp, thr, cut});
  });
  const std::size_t written = static_cast<std::size_t>(kept - idx);
  detail::for_each_index(written, gather_value{x, idx, val});
  return written;
}

void scatter_zero(float* x, const std::uint32_t* idx, std::size_t k) {
  detail::for_each_index(k, zero_at{x, idx});
}

void scatter(float* x, const std::uint32_t* idx, const float* val, std::size_t k, bool add) {
  detail::for_each_index(k, scatter_at{x, idx, val, add});
}

}  // namespace ps::PS_KERNELS_NS
