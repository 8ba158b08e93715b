// CUDA kernels of salus-tune's CUDA backend, compiled once per process by
// NVRTC (see kernels/src/cuda/module.rs). Each kernel mirrors the CPU op of
// the same name in kernels/src/cpu/ and is batched over slots: grid.y (or
// grid.x for the losses) indexes the slot, and per-slot scalars that stay
// fixed arrive by value in fixed-size arrays of MAX_SLOTS entries. The host
// splits larger calls into chunks of MAX_SLOTS slots. Values that change
// every step (batch indices, dropout steps, Adam's bias corrections) are
// read from the lane's step block in device memory, indexed by slot, so that
// an iteration's launches stay the same and can be replayed as a graph.

#define MAX_SLOTS 32

typedef unsigned long long u64;

// len: the slot's own parameters from the run's start (a ragged run).
struct SgdParam { float lr; float momentum; float weight_decay; int nesterov; unsigned int len; };
struct SgdParams { SgdParam s[MAX_SLOTS]; };

struct AdamParam { float decay; float l2; float beta1; float beta2; float eps; unsigned int len; };
struct AdamParams { AdamParam s[MAX_SLOTS]; };

struct DropoutParam { u64 seed; float p; float scale; unsigned int width; unsigned int stride; };
struct DropoutParams { DropoutParam s[MAX_SLOTS]; };

#define GRID_STRIDE(i, n) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (u64)gridDim.x * blockDim.x)

// 64-bit division costs several times 32-bit division on the GPU, and the
// index arithmetic of the element-wise kernels below is most of their work;
// every real operand fits in 32 bits, so take the short path when it does.
__device__ __forceinline__ void divmod(u64 a, u64 b, u64* q, u64* r) {
    if (((a | b) >> 32) == 0) {
        unsigned int qa = (unsigned int)a / (unsigned int)b;
        *q = qa;
        *r = (unsigned int)a - qa * (unsigned int)b;
    } else {
        *q = a / b;
        *r = a % b;
    }
}

// --- counter-based RNG: the same bits as kernels/src/rng.rs -------------

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float uniform01(u64 seed, u64 step, u64 index) {
    u64 s = mix64(seed ^ (step * 0x9e3779b97f4a7c15ULL));
    u64 b = mix64(s + index * 0xd1b54a32d192ed03ULL);
    return (float)(b >> 40) * (1.0f / 16777216.0f);
}

// --- element-wise --------------------------------------------------------

#define GELU_C 0.7978846f
#define GELU_A 0.044715f

// act: 0 relu, 1 gelu (tanh), 2 tanh, 3 sigmoid. Matches ops::Activation.
__device__ __forceinline__ float act_forward(int act, float v) {
    switch (act) {
    case 0: return fmaxf(v, 0.0f);
    case 1: return 0.5f * v * (1.0f + tanhf(GELU_C * (v + GELU_A * v * v * v)));
    case 2: return tanhf(v);
    default: return 1.0f / (1.0f + expf(-v));
    }
}

extern "C" __global__ void activation(int act, u64 n, const float* x, float* y) {
    GRID_STRIDE(i, n) {
        y[i] = act_forward(act, x[i]);
    }
}

extern "C" __global__ void activation_backward(
    int act, u64 n, const float* x, const float* y, const float* dy, float* dx) {
    GRID_STRIDE(i, n) {
        float g;
        switch (act) {
        case 0: g = x[i] > 0.0f ? 1.0f : 0.0f; break;
        case 1: {
            float v = x[i];
            float t = tanhf(GELU_C * (v + GELU_A * v * v * v));
            g = 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * GELU_C * (1.0f + 3.0f * GELU_A * v * v);
            break;
        }
        case 2: g = 1.0f - y[i] * y[i]; break;
        default: g = y[i] * (1.0f - y[i]); break;
        }
        dx[i] = g * dy[i];
    }
}

// y = x * mask over slots of per_slot elements; serves forward and backward.
// steps: two words per slot (the u64 step, low word first). A slot whose
// rows are padded (stride > 0) draws each element's mask at its index in
// its own contiguous rows, as it does alone; its padding is set to 0.
extern "C" __global__ void dropout(
    u64 per_slot, DropoutParams ps, const unsigned int* steps, const float* x, float* y) {
    DropoutParam d = ps.s[blockIdx.y];
    u64 step = (u64)steps[2 * blockIdx.y] | ((u64)steps[2 * blockIdx.y + 1] << 32);
    u64 base = (u64)blockIdx.y * per_slot;
    GRID_STRIDE(i, per_slot) {
        u64 own = i;
        bool pad = false;
        if (d.stride > 0) {
            u64 row, col;
            divmod(i, d.stride, &row, &col);
            pad = col >= d.width;
            own = row * d.width + col;
        }
        float s = 1.0f;
        if (pad) s = 0.0f;
        else if (d.p > 0.0f) s = uniform01(d.seed, step, own) < d.p ? 0.0f : d.scale;
        y[base + i] = pad ? 0.0f : x[base + i] * s;
    }
}

extern "C" __global__ void bias_add(
    u64 slots, u64 rows, u64 cols, u64 bias_stride, float* x, const float* bias) {
    u64 per_slot = rows * cols;
    GRID_STRIDE(i, slots * per_slot) {
        u64 slot, in_slot, row, c;
        divmod(i, per_slot, &slot, &in_slot);
        divmod(in_slot, cols, &row, &c);
        x[i] += bias[slot * bias_stride + c];
    }
}

// A hidden layer's bias and activation in one pass: x += bias (per slot and
// column, as bias_add), then y = act(x) (as activation), with the same bits
// as the two kernels, and one read of x fewer.
extern "C" __global__ void bias_activation(
    int act, u64 slots, u64 rows, u64 cols, u64 bias_stride, float* x, const float* bias,
    float* y) {
    u64 per_slot = rows * cols;
    GRID_STRIDE(i, slots * per_slot) {
        u64 slot, in_slot, row, c;
        divmod(i, per_slot, &slot, &in_slot);
        divmod(in_slot, cols, &row, &c);
        float v = x[i] + bias[slot * bias_stride + c];
        x[i] = v;
        y[i] = act_forward(act, v);
    }
}

// Column sums per slot. A block is COLSUM_COLS columns of one slot: each of
// its COLSUM_ROWS thread rows sums every COLSUM_ROWS-th row of the batch,
// and the partial sums are added in a fixed order, so the bits do not
// depend on the launch. (One thread per column, summing 128 rows alone,
// took 14 us on an H200, for a kernel that moves a few kilobytes.)
#define COLSUM_COLS 32
#define COLSUM_ROWS 8

extern "C" __global__ void col_sum(
    u64 slots, u64 rows, u64 cols, u64 db_stride, const float* dy, float* db) {
    __shared__ float part[COLSUM_ROWS][COLSUM_COLS + 1];
    u64 c = (u64)blockIdx.x * COLSUM_COLS + threadIdx.x;
    for (u64 slot = blockIdx.y; slot < slots; slot += gridDim.y) {
        float acc = 0.0f;
        if (c < cols) {
            const float* p = dy + slot * rows * cols + c;
            for (u64 r = threadIdx.y; r < rows; r += COLSUM_ROWS) acc += p[r * cols];
        }
        part[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && c < cols) {
            float sum = 0.0f;
            for (int k = 0; k < COLSUM_ROWS; ++k) sum += part[k][threadIdx.x];
            db[slot * db_stride + c] = sum;
        }
        __syncthreads();
    }
}

// A row index past the end of src gives a zero row (the host checks first).
extern "C" __global__ void gather_rows(
    u64 nrows, u64 cols, u64 src_rows, const unsigned int* idx, const float* src, float* dst) {
    GRID_STRIDE(i, nrows * cols) {
        u64 r, c;
        divmod(i, cols, &r, &c);
        u64 s = (u64)idx[r];
        dst[i] = s < src_rows ? src[s * cols + c] : 0.0f;
    }
}

// --- losses: one block per slot, rows split over threads -----------------

#define LOSS_THREADS 256

// stats per slot: [a, b, rows, bad] (see STATS_LEN in kernels/src/ops.rs).
__device__ void write_stats(
    float* stats, int accumulate, double a, double b, double rows, double bad) {
    __shared__ double sa[LOSS_THREADS];
    __shared__ double sb[LOSS_THREADS];
    __shared__ double sc[LOSS_THREADS];
    sa[threadIdx.x] = a;
    sb[threadIdx.x] = b;
    sc[threadIdx.x] = bad;
    __syncthreads();
    for (unsigned int w = blockDim.x / 2; w > 0; w >>= 1) {
        if (threadIdx.x < w) {
            sa[threadIdx.x] += sa[threadIdx.x + w];
            sb[threadIdx.x] += sb[threadIdx.x + w];
            sc[threadIdx.x] += sc[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        float* out = stats + (u64)blockIdx.x * 4;
        if (accumulate) {
            out[0] += (float)sa[0];
            out[1] += (float)sb[0];
            out[2] += (float)rows;
            out[3] += (float)sc[0];
        } else {
            out[0] = (float)sa[0];
            out[1] = (float)sb[0];
            out[2] = (float)rows;
            out[3] = (float)sc[0];
        }
    }
}

// Labels are class indices stored as floats. dlogits may be null.
extern "C" __global__ void softmax_xent(
    u64 rows, u64 cols, u64 label_stride, const float* logits, const float* labels,
    float* dlogits, float* stats, int accumulate) {
    u64 slot = blockIdx.x;
    float inv_rows = 1.0f / (float)(rows > 0 ? rows : 1);
    double loss = 0.0, correct = 0.0, bad = 0.0;
    for (u64 r = threadIdx.x; r < rows; r += blockDim.x) {
        u64 off = (slot * rows + r) * cols;
        const float* z = logits + off;
        float l = labels[slot * label_stride + r];
        // Loaders validate labels; one that is not a class index is counted
        // (stats[3]) and adds no loss and no gradient, as on the CPU.
        if (!(l >= 0.0f && l < (float)cols && floorf(l) == l)) {
            bad += 1.0;
            if (dlogits)
                for (u64 j = 0; j < cols; ++j) dlogits[off + j] = 0.0f;
            continue;
        }
        u64 label = (u64)l;
        u64 best = 0;
        float mx = __int_as_float(0xff800000);
        for (u64 j = 0; j < cols; ++j) {
            if (z[j] > mx) { mx = z[j]; best = j; }
        }
        float sum = 0.0f;
        for (u64 j = 0; j < cols; ++j) sum += expf(z[j] - mx);
        float lse = mx + logf(sum);
        loss += (double)(lse - z[label]);
        correct += best == label ? 1.0 : 0.0;
        if (dlogits) {
            float inv_sum = 1.0f / sum;
            for (u64 j = 0; j < cols; ++j)
                dlogits[off + j] = (expf(z[j] - mx) * inv_sum - (j == label ? 1.0f : 0.0f)) * inv_rows;
        }
    }
    write_stats(stats, accumulate, loss, correct, (double)rows, bad);
}

extern "C" __global__ void mse(
    u64 rows, u64 cols, u64 target_stride, const float* pred, const float* target,
    float* dpred, float* stats, int accumulate) {
    u64 slot = blockIdx.x;
    float scale = 2.0f / (float)(rows * cols > 0 ? rows * cols : 1);
    double sse = 0.0;
    for (u64 r = threadIdx.x; r < rows; r += blockDim.x) {
        u64 off = (slot * rows + r) * cols;
        u64 toff = slot * target_stride + r * cols;
        for (u64 j = 0; j < cols; ++j) {
            float e = pred[off + j] - target[toff + j];
            sse += (double)(e * e);
            if (dpred) dpred[off + j] = scale * e;
        }
    }
    write_stats(stats, accumulate, sse / (double)cols, sse, (double)rows, 0.0);
}

// --- optimizers, in PyTorch's semantics ----------------------------------

// velocity may be null; a slot with momentum 0 takes the plain step.
// Slot s's n parameters start at s * stride (a layer's run, or stride = n);
// it steps the first h.len of them (a group of mixed shapes' own ones).
extern "C" __global__ void sgd_step(
    u64 n, u64 stride, SgdParams ps, float* params, const float* grads, float* velocity) {
    SgdParam h = ps.s[blockIdx.y];
    u64 base = (u64)blockIdx.y * stride;
    u64 own = min(n, (u64)h.len);
    GRID_STRIDE(i, own) {
        u64 j = base + i;
        float p = params[j];
        float g = grads[j];
        if (velocity && h.momentum != 0.0f) {
            if (h.nesterov) {
                float gi = g + h.weight_decay * p;
                float v = h.momentum * velocity[j] + gi;
                velocity[j] = v;
                params[j] = p - h.lr * (gi + h.momentum * v);
            } else {
                float v = h.momentum * velocity[j] + g + h.weight_decay * p;
                velocity[j] = v;
                params[j] = p - h.lr * v;
            }
        } else {
            params[j] = p - h.lr * (g + h.weight_decay * p);
        }
    }
}

// scalars: two floats per slot, [step_size, inv_sqrt_bc2], from the step block.
// Slot s's n parameters start at s * stride, as in sgd_step.
extern "C" __global__ void adam_step(
    u64 n, u64 stride, AdamParams ps, const float* scalars, float* params, const float* grads,
    float* m, float* v) {
    AdamParam h = ps.s[blockIdx.y];
    float step_size = scalars[2 * blockIdx.y];
    float inv_sqrt_bc2 = scalars[2 * blockIdx.y + 1];
    u64 base = (u64)blockIdx.y * stride;
    u64 own = min(n, (u64)h.len);
    GRID_STRIDE(i, own) {
        u64 j = base + i;
        float p = params[j];
        float gi = grads[j] + h.l2 * p;
        float mj = h.beta1 * m[j] + (1.0f - h.beta1) * gi;
        float vj = h.beta2 * v[j] + (1.0f - h.beta2) * gi * gi;
        m[j] = mj;
        v[j] = vj;
        float denom = sqrtf(vj) * inv_sqrt_bc2 + h.eps;
        params[j] = p * h.decay - step_size * mj / denom;
    }
}

// --- convolutional layers: NHWC images (see kernels/src/ops.rs) ----------
// Images of slot s start at x + s * slot_stride; outputs and gradients are
// packed. Each output element is computed by one thread that sums in a fixed
// order (gathers, never atomics), so results do not depend on the launch.

struct ConvGeom {
    u64 slots, n, h, w, c, slot_stride, kh, kw, stride, pad, oh, ow;
};

// Element i of packed NHWC images of h x w x c: its image (counted over
// all slots), row, column and channel.
__device__ __forceinline__ void nhwc_index(
    u64 i, u64 h, u64 w, u64 c, u64* image, u64* y, u64* x, u64* ch) {
    u64 rest, pix;
    divmod(i, c, &rest, ch);
    divmod(rest, h * w, image, &pix);
    divmod(pix, w, y, x);
}

extern "C" __global__ void im2col(ConvGeom g, const float* x, float* cols) {
    u64 patch = g.kh * g.kw * g.c;
    u64 rows = g.n * g.oh * g.ow;
    GRID_STRIDE(i, g.slots * rows * patch) {
        u64 sr, p, s, r, img, pos, oy, ox, kk, ci, ki, kj;
        divmod(i, patch, &sr, &p);
        divmod(sr, rows, &s, &r);
        divmod(r, g.oh * g.ow, &img, &pos);
        divmod(pos, g.ow, &oy, &ox);
        divmod(p, g.c, &kk, &ci);
        divmod(kk, g.kw, &ki, &kj);
        long long iy = (long long)(oy * g.stride + ki) - (long long)g.pad;
        long long ix = (long long)(ox * g.stride + kj) - (long long)g.pad;
        float v = 0.0f;
        if (iy >= 0 && iy < (long long)g.h && ix >= 0 && ix < (long long)g.w)
            v = x[s * g.slot_stride + ((img * g.h + (u64)iy) * g.w + (u64)ix) * g.c + ci];
        cols[i] = v;
    }
}

extern "C" __global__ void col2im(ConvGeom g, const float* cols, float* dx, int accumulate) {
    u64 patch = g.kh * g.kw * g.c;
    GRID_STRIDE(i, g.slots * g.n * g.h * g.w * g.c) {
        u64 ci, iy, ix, si, s, img;
        nhwc_index(i, g.h, g.w, g.c, &si, &iy, &ix, &ci);
        divmod(si, g.n, &s, &img);
        float acc = 0.0f;
        for (u64 ki = 0; ki < g.kh; ++ki) {
            long long ty = (long long)(iy + g.pad) - (long long)ki;
            if (ty < 0 || ty % (long long)g.stride != 0) continue;
            u64 oy = (u64)ty / g.stride;
            if (oy >= g.oh) continue;
            for (u64 kj = 0; kj < g.kw; ++kj) {
                long long tx = (long long)(ix + g.pad) - (long long)kj;
                if (tx < 0 || tx % (long long)g.stride != 0) continue;
                u64 ox = (u64)tx / g.stride;
                if (ox >= g.ow) continue;
                u64 row = (s * g.n + img) * g.oh * g.ow + oy * g.ow + ox;
                acc += cols[row * patch + (ki * g.kw + kj) * g.c + ci];
            }
        }
        dx[i] = accumulate ? dx[i] + acc : acc;
    }
}

// The first largest value of a window (row-major), NaN winning, as the CPU.
__device__ __forceinline__ void window_max(
    ConvGeom g, const float* img, u64 oy, u64 ox, u64 ci, float* best, u64* at) {
    *best = 0.0f;
    *at = ~0ULL;
    for (u64 ki = 0; ki < g.kh; ++ki) {
        for (u64 kj = 0; kj < g.kw; ++kj) {
            u64 p = (oy * g.stride + ki) * g.w + ox * g.stride + kj;
            float v = img[p * g.c + ci];
            if (*at == ~0ULL || v > *best || (isnan(v) && !isnan(*best))) {
                *best = v;
                *at = p;
            }
        }
    }
}

// kind: 0 max, 1 average. Pooling has no padding (pad is 0 in g).
extern "C" __global__ void pool2d(int kind, ConvGeom g, const float* x, float* y) {
    float inv = 1.0f / (float)(g.kh * g.kw);
    GRID_STRIDE(i, g.slots * g.n * g.oh * g.ow * g.c) {
        u64 ci, oy, ox, si, s, img;
        nhwc_index(i, g.oh, g.ow, g.c, &si, &oy, &ox, &ci);
        divmod(si, g.n, &s, &img);
        const float* src = x + s * g.slot_stride + img * g.h * g.w * g.c;
        if (kind == 0) {
            float best;
            u64 at;
            window_max(g, src, oy, ox, ci, &best, &at);
            y[i] = best;
        } else {
            float sum = 0.0f;
            for (u64 ki = 0; ki < g.kh; ++ki)
                for (u64 kj = 0; kj < g.kw; ++kj)
                    sum += src[((oy * g.stride + ki) * g.w + ox * g.stride + kj) * g.c + ci];
            y[i] = sum * inv;
        }
    }
}

extern "C" __global__ void pool2d_backward(
    int kind, ConvGeom g, const float* x, const float* dy, float* dx) {
    float inv = 1.0f / (float)(g.kh * g.kw);
    GRID_STRIDE(i, g.slots * g.n * g.h * g.w * g.c) {
        u64 ci, iy, ix, si, s, img;
        nhwc_index(i, g.h, g.w, g.c, &si, &iy, &ix, &ci);
        divmod(si, g.n, &s, &img);
        const float* src = x + s * g.slot_stride + img * g.h * g.w * g.c;
        const float* d = dy + si * g.oh * g.ow * g.c;
        u64 oy0 = iy + 1 > g.kh ? (iy + 1 - g.kh + g.stride - 1) / g.stride : 0;
        u64 ox0 = ix + 1 > g.kw ? (ix + 1 - g.kw + g.stride - 1) / g.stride : 0;
        float acc = 0.0f;
        for (u64 oy = oy0; oy <= iy / g.stride && oy < g.oh; ++oy) {
            for (u64 ox = ox0; ox <= ix / g.stride && ox < g.ow; ++ox) {
                float grad = d[(oy * g.ow + ox) * g.c + ci];
                if (kind == 0) {
                    float best;
                    u64 at;
                    window_max(g, src, oy, ox, ci, &best, &at);
                    if (at == iy * g.w + ix) acc += grad;
                } else {
                    acc += grad * inv;
                }
            }
        }
        dx[i] = acc;
    }
}

// Batch norm: a block is BN_COLS channels of one slot (blockIdx.y), its
// BN_ROWS thread rows summing every BN_ROWS-th row, in double, reduced in a
// fixed order.
#define BN_COLS 32
#define BN_ROWS 16

__device__ double bn_block_sum(double v, double (*part)[BN_COLS + 1]) {
    part[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    double sum = 0.0;
    for (int k = 0; k < BN_ROWS; ++k) sum += part[k][threadIdx.x];
    __syncthreads();
    return sum;
}

// saved: per slot [mean; cols] then [1/std; cols].
extern "C" __global__ void bn_stats(
    u64 rows, u64 cols, u64 running_stride, float momentum, float eps, const float* x,
    float* running, float* saved) {
    __shared__ double part[BN_ROWS][BN_COLS + 1];
    u64 c = (u64)blockIdx.x * BN_COLS + threadIdx.x;
    u64 slot = blockIdx.y;
    const float* xs = x + slot * rows * cols;
    double acc = 0.0;
    if (c < cols)
        for (u64 r = threadIdx.y; r < rows; r += BN_ROWS) acc += (double)xs[r * cols + c];
    double mean = bn_block_sum(acc, part) / (double)rows;
    acc = 0.0;
    if (c < cols)
        for (u64 r = threadIdx.y; r < rows; r += BN_ROWS) {
            double d = (double)xs[r * cols + c] - mean;
            acc += d * d;
        }
    double sq = bn_block_sum(acc, part);
    if (threadIdx.y == 0 && c < cols) {
        double var = sq / (double)rows;
        saved[slot * 2 * cols + c] = (float)mean;
        saved[slot * 2 * cols + cols + c] = (float)(1.0 / sqrt(var + (double)eps));
        float* run = running + slot * running_stride;
        double m = (double)momentum;
        run[c] = (float)((1.0 - m) * (double)run[c] + m * mean);
        run[cols + c] = (float)((1.0 - m) * (double)run[cols + c] + m * sq / (double)(rows - 1));
    }
}

// y = gamma * ((x - mean) * inv_std) + beta. stats per slot (stat_stride
// apart): [mean; cols], then [1/std; cols], or [var; cols] when eval (the
// running statistics, with eps).
extern "C" __global__ void bn_apply(
    int eval, u64 slots, u64 rows, u64 cols, u64 param_stride, u64 stat_stride, float eps,
    const float* x, const float* params, const float* stats, float* y) {
    GRID_STRIDE(i, slots * rows * cols) {
        u64 sr, c, slot, r;
        divmod(i, cols, &sr, &c);
        divmod(sr, rows, &slot, &r);
        const float* st = stats + slot * stat_stride;
        const float* p = params + slot * param_stride;
        float inv = eval ? 1.0f / sqrtf(st[cols + c] + eps) : st[cols + c];
        y[i] = __fadd_rn(__fmul_rn(p[c], __fmul_rn(__fsub_rn(x[i], st[c]), inv)), p[cols + c]);
    }
}

// dparams per slot: [d gamma; cols] = sum dy * xhat, [d beta; cols] = sum dy.
extern "C" __global__ void bn_backward_reduce(
    u64 rows, u64 cols, u64 param_stride, const float* x, const float* saved, const float* dy,
    float* dparams) {
    __shared__ double part[BN_ROWS][BN_COLS + 1];
    u64 c = (u64)blockIdx.x * BN_COLS + threadIdx.x;
    u64 slot = blockIdx.y;
    u64 base = slot * rows * cols;
    double sdy = 0.0, sdyx = 0.0;
    if (c < cols) {
        float mean = saved[slot * 2 * cols + c];
        float inv = saved[slot * 2 * cols + cols + c];
        for (u64 r = threadIdx.y; r < rows; r += BN_ROWS) {
            float g = dy[base + r * cols + c];
            float xhat = __fmul_rn(__fsub_rn(x[base + r * cols + c], mean), inv);
            sdy += (double)g;
            sdyx += (double)g * (double)xhat;
        }
    }
    sdy = bn_block_sum(sdy, part);
    sdyx = bn_block_sum(sdyx, part);
    if (threadIdx.y == 0 && c < cols) {
        dparams[slot * param_stride + c] = (float)sdyx;
        dparams[slot * param_stride + cols + c] = (float)sdy;
    }
}

extern "C" __global__ void bn_backward_dx(
    u64 slots, u64 rows, u64 cols, u64 param_stride, const float* x, const float* params,
    const float* saved, const float* dy, const float* dparams, float* dx) {
    float m = (float)rows;
    GRID_STRIDE(i, slots * rows * cols) {
        u64 sr, c, slot, r;
        divmod(i, cols, &sr, &c);
        divmod(sr, rows, &slot, &r);
        float mean = saved[slot * 2 * cols + c];
        float inv = saved[slot * 2 * cols + cols + c];
        const float* p = params + slot * param_stride;
        const float* dp = dparams + slot * param_stride;
        float xhat = (x[i] - mean) * inv;
        float scale = p[c] * inv / m;
        dx[i] = scale * (m * dy[i] - dp[cols + c] - xhat * dp[c]);
    }
}

extern "C" __global__ void add(u64 n, const float* x, float* y) {
    GRID_STRIDE(i, n) {
        y[i] += x[i];
    }
}

// The device pointer arrays of a grouped GEMM: member i's A, B and C lie
// i strides (in floats) from the bases. out: 3 * count pointers.
extern "C" __global__ void grouped_pointers(u64 count, const float* a, u64 sa, const float* b,
                                            u64 sb, float* c, u64 sc, u64* out) {
    GRID_STRIDE(i, count) {
        out[i] = (u64)(a + i * sa);
        out[count + i] = (u64)(b + i * sb);
        out[2 * count + i] = (u64)(c + i * sc);
    }
}

// Random crop (a shift of up to pad pixels each way, zeros outside) and
// horizontal flip of packed NHWC images, per slot; the draws are those of
// AugmentSlot::draw in kernels/src/ops.rs. steps: two words per slot.
struct AugmentParam { u64 seed; unsigned int pad; int flip; };
struct AugmentParams { AugmentParam s[MAX_SLOTS]; };
#define AUGMENT_STREAM 0xa6a6000000000001ULL

extern "C" __global__ void augment(
    u64 n, u64 h, u64 w, u64 c, AugmentParams ps, const unsigned int* steps, const float* x,
    float* y) {
    AugmentParam a = ps.s[blockIdx.y];
    u64 step = (u64)steps[2 * blockIdx.y] | ((u64)steps[2 * blockIdx.y + 1] << 32);
    u64 per_image = h * w * c;
    u64 base = (u64)blockIdx.y * n * per_image;
    u64 seed = a.seed ^ AUGMENT_STREAM;
    u64 span = 2 * (u64)a.pad + 1;
    GRID_STRIDE(i, n * per_image) {
        u64 img, rest, pix, ch, r, col;
        divmod(i, per_image, &img, &rest);
        divmod(rest, c, &pix, &ch);
        divmod(pix, w, &r, &col);
        u64 sy = (u64)(uniform01(seed, step, 3 * img) * (float)span);
        u64 sx = (u64)(uniform01(seed, step, 3 * img + 1) * (float)span);
        long long dy = (long long)(sy < span - 1 ? sy : span - 1) - (long long)a.pad;
        long long dx = (long long)(sx < span - 1 ? sx : span - 1) - (long long)a.pad;
        int flip = a.flip && uniform01(seed, step, 3 * img + 2) < 0.5f;
        long long sr = (long long)r + dy;
        long long sc = (long long)(flip ? w - 1 - col : col) + dx;
        float v = 0.0f;
        if (sr >= 0 && sc >= 0 && sr < (long long)h && sc < (long long)w)
            v = x[base + img * per_image + ((u64)sr * w + (u64)sc) * c + ch];
        y[base + i] = v;
    }
}
