// The kernel API, declared once and included by kernels.hpp (namespace ps::kernels, Thrust's
// OpenMP host backend: pointers are host memory) and by kernels_cuda.hpp (namespace
// ps::kernels_cuda, Thrust's CUDA backend: pointers are device memory). No Thrust types here.
// Every kernel is one Thrust source in kernels/<name>.cu. n == 0 is always allowed.
// Pointers of one call must not overlap unless a comment says so.

// ---- sum.cu: sum of N buffers -------------------------------------------------------------
// out[i] = in[0][i] + in[1][i] + ... + in[k-1][i], added left to right (so integer-valued
// floats give exact sums). k >= 1; out may be one of the inputs. k == 0 zero-fills out.
// `in` is a host array of k pointers (into the backend's memory).
void sum_n(float* out, const float* const* in, std::size_t k, std::size_t n);
// y[i] += x[i]
void add(float* y, const float* x, std::size_t n);

// ---- axpy.cu: scale, axpy, copy -----------------------------------------------------------
void scale(float* x, float a, std::size_t n);                       // x[i] *= a
void axpy(float* y, float a, const float* x, std::size_t n);        // y[i] += a * x[i]
void copy(float* dst, const float* src, std::size_t n);             // dst[i] = src[i]

// ---- sgd.cu, adagrad.cu, adam.cu: update rules (semantics in libps/core/update_rule.hpp) --------
void sgd(float* w, const float* g, float lr, std::size_t n);        // w -= lr*g
void sgd_momentum(float* w, float* v, const float* g, float lr, float momentum, std::size_t n);
void adagrad(float* w, float* h, const float* g, float lr, float eps, std::size_t n);
// t holds the per-parameter step count as a float (exact up to 2^24 steps).
void adam(float* w, float* m, float* v, float* t, const float* g, float lr, float beta1,
          float beta2, float eps, std::size_t n);

// ---- fp16.cu: IEEE binary16, round to nearest even -------------------------------------------
// |x| >= 65520 (the midpoint above 65504, the largest half) becomes +-Inf; +-Inf stays +-Inf;
// NaN becomes the quiet NaN 0x7e00 with the sign kept; subnormal halves are produced (no
// flush to zero). Decoding is exact. Error for finite |x| < 65520:
// |x - decode(encode(x))| <= max(|x| * 2^-11, 2^-25).
void fp16_encode(const float* x, std::uint16_t* h, std::size_t n);
void fp16_decode(const std::uint16_t* h, float* x, std::size_t n);      // x[i] = half h[i]
void fp16_decode_add(const std::uint16_t* h, float* x, std::size_t n);  // x[i] += half h[i]

// ---- int8.cu: int8 with one float scale per block --------------------------------------------
// Block b covers [b*block, min((b+1)*block, n)). scale[b] = max |x| over the block's finite
// values / 127, raised to FLT_MIN when positive and smaller (so 1/scale is finite); 0 for a
// block with no nonzero finite value. q[i] = round-to-nearest-even(x[i] / scale) clamped to
// [-127, 127]; non-finite x[i] (NaN, +-Inf) get q[i] = 0 and are listed separately (see
// int8_nonfinite). Decoding gives q*scale clamped to +-FLT_MAX. Error for finite x:
// |x - x'| <= scale * (0.5 + 2^-15) (scale/2 plus float rounding in 1/scale and q*scale).
// Returns the number of non-finite values.
std::size_t int8_encode(const float* x, std::size_t n, std::size_t block, float* scales,
                        std::int8_t* q);
// Writes the indices (ascending) and values of the non-finite x[i]; returns how many.
std::size_t int8_nonfinite(const float* x, std::size_t n, std::uint32_t* idx, float* val);
// out = q*scale (add: out += q*scale).
void int8_decode(const std::int8_t* q, const float* scales, std::size_t n, std::size_t block,
                 float* out, bool add);

// ---- topk.cu: top-k selection and sparse updates -----------------------------------------------
// Selects the k entries of largest |x| (k is clamped to n) and writes their indices, ascending,
// and values. Order by |x| bit pattern: NaN ranks above +-Inf, which ranks above every finite
// value; among equal |x| the lower index wins, so the result is deterministic. n < 2^32.
// Returns the number written (min(k, n)).
std::size_t topk_select(const float* x, std::size_t n, std::size_t k, std::uint32_t* idx,
                        float* val);
// x[idx[j]] = 0 for j < k (indices distinct).
void scatter_zero(float* x, const std::uint32_t* idx, std::size_t k);
// x[idx[j]] = val[j] (set) or x[idx[j]] += val[j] (add), for j < k (indices distinct).
void scatter(float* x, const std::uint32_t* idx, const float* val, std::size_t k, bool add);

// ---- dense.cu: a fully connected layer and the logistic loss (train_ctr's tower) ----------------
// Row-major: x and dx are batch x in, y and dy batch x out, w out x in, b out.
// y[s][o] = b[o] + sum_i w[o][i] x[s][i], then max(0, y) when relu.
void dense_forward(const float* w, const float* b, const float* x, float* y, std::size_t batch, std::size_t in,
                   std::size_t out, bool relu);
// gw[o][i] = sum_s dy[s][o] x[s][i]; gb[o] = sum_s dy[s][o] (overwritten, summed over s in order).
void dense_weight_grad(const float* dy, const float* x, float* gw, float* gb, std::size_t batch, std::size_t in,
                       std::size_t out);
// dx[s][i] = sum_o dy[s][o] w[o][i] (o in order), then 0 where mask[s][i] <= 0 when mask is
// not null (mask: the ReLU output that x was, so the gradient passes through it).
void dense_input_grad(const float* dy, const float* w, const float* mask, float* dx, std::size_t batch,
                      std::size_t in, std::size_t out);
// delta[s] = (sigmoid(logits[s]) - labels[s]) / n, the mean loss's gradient; returns the mean
// of log(1 + e^z) - y z (labels 0 or 1), computed in double without overflow. n == 0 gives 0.
double logistic_loss(const float* logits, const float* labels, float* delta, std::size_t n);
