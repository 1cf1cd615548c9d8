#include "nn/numerics.h"
#include "kernels/kernels.h"
#include "kernels/plain_c_targets.h"

#include <math.h>

/* Reductions that the official code does in f32 with an unspecified order (torch's CPU sums,
 * GPU warp reductions) are accumulated here in f64 and rounded once: the result is the correctly
 * rounded sum, which is what any good f32 summation order is closest to. */
static float sum_squares(const float *x, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return (float)s;
}

void rmsnorm_bf16(const float *x, const float *weight, int n, float eps, float *y) {
    float var = sum_squares(x, n) / (float)n;
    float r = 1.0f / sqrtf(var + eps);
    for (int i = 0; i < n; i++) {
        float xn = x[i] * r;
        y[i] = bf16_round(weight[i] * xn);
    }
}

typedef struct norm_rows_job {
    float *x; /* [rows][n], normalised in place */
    const float *weight;
    int n;
    float eps;
} norm_rows_job;

static void norm_rows(void *ctx, int begin, int end) {
    const norm_rows_job *j = ctx;
    for (int t = begin; t < end; t++) rmsnorm_bf16(j->x + (size_t)t * j->n, j->weight, j->n, j->eps, j->x + (size_t)t * j->n);
}

void rmsnorm_bf16_rows(float *x, const float *weight, int n, float eps, int rows) {
    norm_rows_job j = {x, weight, n, eps};
    kernels_parallel_rows(norm_rows, &j, rows);
}

/* All values are multiples of the smallest one's last bit, 2^(emin - 134) for biased exponent
 * emin, and their total stays below 2^53 of those: then every partial sum is exact in f64 and every
 * order gives the same bits, so the sum runs in eight independent chains (the sequential one is
 * bound by the latency of its adds). Infinities and NaNs take the sequential path. */
static inline __attribute__((always_inline)) double sum_nonnegative_bf16_inline(const float *v, int n) {
    uint32_t emin = 255, emax = 0;
    for (int i = 0; i < n; i++) {
        const uint32_t u = f32_bits(v[i]), e = u >> 23 ? u >> 23 : 1; /* subnormals: the lsb of exponent 1 */
        if (u) {
            emin = e < emin ? e : emin;
            emax = e > emax ? e : emax;
        }
    }
    int log2n = 0;
    while ((1 << log2n) < n) log2n++;
    if (emax < 255 && (emax < emin || log2n + (int)(emax - emin) + 8 <= 53)) {
        double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int i = 0;
        for (; i + 8 <= n; i += 8)
            for (int k = 0; k < 8; k++) lane[k] += (double)v[i + k];
        for (; i < n; i++) lane[0] += (double)v[i];
        return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
    }
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)v[i];
    return s;
}

double sum_nonnegative_bf16(const float *v, int n) { return sum_nonnegative_bf16_inline(v, n); }

/* plain C copies per vector level (kernels/plain_c_targets.h) */
static inline __attribute__((always_inline)) void head_rms_normalize_body(float *q, int n, float eps) {
    enum { MAX_HEAD = 1024 };
    float squares[MAX_HEAD];
    double s = 0;
    if (n <= MAX_HEAD) {
        for (int i = 0; i < n; i++) squares[i] = q[i] * q[i];
        bf16_round_array(squares, (size_t)n);
        s = sum_nonnegative_bf16_inline(squares, n);
    } else {
        for (int i = 0; i < n; i++) s += (double)bf16_round(q[i] * q[i]);
    }
    float mean = bf16_round((float)s / (float)n);
    float v = bf16_round(mean + eps);
    float r = bf16_round(1.0f / sqrtf(v));
    for (int i = 0; i < n; i++) q[i] = q[i] * r;
    bf16_round_array(q, (size_t)n);
}
PLAIN_C_TARGETS(head_rms_normalize, (float *q, int n, float eps), (q, n, eps))

void head_rms_normalize_bf16(float *q, int n, float eps) { PLAIN_C_TARGETS_CALL(head_rms_normalize, (q, n, eps)); }

void fp8_simulate_bf16(float *x, int n, int block) {
    const float inv_qmax = 1.0f / 448.0f;
    for (int b = 0; b < n; b += block) {
        float amax = 0.0f;
        for (int i = b; i < b + block; i++) amax = max_num_f32(amax, fabsf(x[i]));
        float s = pow2_scale_ceil(max_num_f32(amax, 1e-4f), inv_qmax);
        for (int i = b; i < b + block; i++) {
            float q = min_num_f32(max_num_f32(x[i] / s, -448.0f), 448.0f);
            x[i] = bf16_round(e4m3_to_f32(e4m3_encode_rne(q)) * s);
        }
    }
}

/* plain C copies per vector level (kernels/plain_c_targets.h) */
static inline __attribute__((always_inline)) void fp4_simulate_body(float *x, int n, int block) {
    const float inv_qmax = 1.0f / 6.0f;
    for (int b = 0; b < n; b += block) {
        float amax = 0.0f;
        for (int i = b; i < b + block; i++) amax = max_num_f32(amax, fabsf(x[i]));
        float s = pow2_scale_ceil(max_num_f32(amax, 6.0f * 0x1p-126f), inv_qmax);
        for (int i = b; i < b + block; i++) {
            float q = min_num_f32(max_num_f32(x[i] / s, -6.0f), 6.0f);
            x[i] = bf16_round(e2m1_round_value(q) * s);
        }
    }
}
PLAIN_C_TARGETS(fp4_simulate, (float *x, int n, int block), (x, n, block))

void fp4_simulate_bf16(float *x, int n, int block) { PLAIN_C_TARGETS_CALL(fp4_simulate, (x, n, block)); }

void hadamard_bf16(float *x, int n) {
    for (int stride = 1; stride < n; stride *= 2)
        for (int i = 0; i < n; i += 2 * stride)
            for (int j = i; j < i + stride; j++) {
                float a = x[j], b = x[j + stride];
                x[j] = a + b;
                x[j + stride] = a - b;
            }
    const float scale = (float)(1.0 / sqrt((double)n));
    for (int i = 0; i < n; i++) x[i] = bf16_round(x[i] * scale);
}

/* YaRN correction range, in double like the official Python (math.log, floor/ceil). */
static double correction_dim(double rotations, int dims, double base, int max_position) {
    return dims * log(max_position / (rotations * 2 * M_PI)) / (2 * log(base));
}

void rope_table_init(rope_table *t, int dims, double base, int yarn, double factor, int original_max_position,
                     double beta_fast, double beta_slow) {
    t->dims = dims;
    const int half = dims / 2;
    for (int k = 0; k < half; k++) {
        float exponent = (float)(2 * k) / (float)dims;
        t->inv_freq[k] = 1.0f / powf((float)base, exponent);
    }
    if (!yarn) return;
    int low = (int)floor(correction_dim(beta_fast, dims, base, original_max_position));
    int high = (int)ceil(correction_dim(beta_slow, dims, base, original_max_position));
    if (low < 0) low = 0;
    if (high > dims - 1) high = dims - 1;
    float span = low == high ? 0.001f : (float)(high - low);
    for (int k = 0; k < half; k++) {
        float ramp = ((float)k - (float)low) / span;
        ramp = min_num_f32(max_num_f32(ramp, 0.0f), 1.0f);
        float smooth = 1.0f - ramp;
        float f = t->inv_freq[k];
        t->inv_freq[k] = f / (float)factor * (1.0f - smooth) + f * smooth;
    }
}

void rope_angles_at(const rope_table *t, int64_t pos, rope_angles *a) {
    const float p = (float)pos;
    a->dims = t->dims;
    for (int k = 0; k < t->dims / 2; k++) {
        const float angle = p * t->inv_freq[k];
        /* cos/sin correctly rounded (via double): glibc's cosf/sinf are not, at the 1-ulp level. */
        a->cos[k] = (float)cos((double)angle);
        a->sin[k] = (float)sin((double)angle);
    }
}

void rope_rotate_bf16(const rope_angles *a, float *x, int inverse) {
    for (int k = 0; k < a->dims / 2; k++) {
        const float c = a->cos[k], s = inverse ? -a->sin[k] : a->sin[k];
        const float x0 = x[2 * k], x1 = x[2 * k + 1];
        x[2 * k] = bf16_round(x0 * c - x1 * s);
        x[2 * k + 1] = bf16_round(x0 * s + x1 * c);
    }
}

void rope_apply_bf16(const rope_table *t, float *x, int64_t pos, int inverse) {
    rope_angles a;
    rope_angles_at(t, pos, &a);
    rope_rotate_bf16(&a, x, inverse);
}
