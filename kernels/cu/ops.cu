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

struct SgdParam { float lr; float momentum; float weight_decay; int nesterov; };
struct SgdParams { SgdParam s[MAX_SLOTS]; };

struct AdamParam { float decay; float l2; float beta1; float beta2; float eps; float pad; };
struct AdamParams { AdamParam s[MAX_SLOTS]; };

struct DropoutParam { u64 seed; float p; float scale; };
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
// steps: two words per slot (the u64 step, low word first).
extern "C" __global__ void dropout(
    u64 per_slot, DropoutParams ps, const unsigned int* steps, const float* x, float* y) {
    DropoutParam d = ps.s[blockIdx.y];
    u64 step = (u64)steps[2 * blockIdx.y] | ((u64)steps[2 * blockIdx.y + 1] << 32);
    u64 base = (u64)blockIdx.y * per_slot;
    GRID_STRIDE(i, per_slot) {
        float s = 1.0f;
        if (d.p > 0.0f) s = uniform01(d.seed, step, i) < d.p ? 0.0f : d.scale;
        y[base + i] = x[base + i] * s;
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
extern "C" __global__ void sgd_step(
    u64 n, SgdParams ps, float* params, const float* grads, float* velocity) {
    SgdParam h = ps.s[blockIdx.y];
    u64 base = (u64)blockIdx.y * n;
    GRID_STRIDE(i, n) {
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
extern "C" __global__ void adam_step(
    u64 n, AdamParams ps, const float* scalars, float* params, const float* grads, float* m,
    float* v) {
    AdamParam h = ps.s[blockIdx.y];
    float step_size = scalars[2 * blockIdx.y];
    float inv_sqrt_bc2 = scalars[2 * blockIdx.y + 1];
    u64 base = (u64)blockIdx.y * n;
    GRID_STRIDE(i, n) {
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
