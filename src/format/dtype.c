#include "format/dtype.h"

static const struct { dtype t; const char *name; int size; } dtype_info[] = {
    {DTYPE_BF16, "BF16", 2},    {DTYPE_F16, "F16", 2},         {DTYPE_F32, "F32", 4},
    {DTYPE_F64, "F64", 8},      {DTYPE_F8_E4M3, "F8_E4M3", 1}, {DTYPE_F8_E8M0, "F8_E8M0", 1},
    {DTYPE_I8, "I8", 1},        {DTYPE_U8, "U8", 1},           {DTYPE_I16, "I16", 2},
    {DTYPE_I32, "I32", 4},      {DTYPE_I64, "I64", 8},         {DTYPE_BOOL, "BOOL", 1},
};

int dtype_size(dtype t) {
    for (size_t i = 0; i < sizeof dtype_info / sizeof dtype_info[0]; i++)
        if (dtype_info[i].t == t) return dtype_info[i].size;
    return 0;
}

const char *dtype_name(dtype t) {
    for (size_t i = 0; i < sizeof dtype_info / sizeof dtype_info[0]; i++)
        if (dtype_info[i].t == t) return dtype_info[i].name;
    return "INVALID";
}

dtype dtype_from_name(const char *name) {
    for (size_t i = 0; i < sizeof dtype_info / sizeof dtype_info[0]; i++)
        if (!strcmp(dtype_info[i].name, name)) return dtype_info[i].t;
    return DTYPE_INVALID;
}

/* e4m3fn: exponent 0 => subnormal mant*2^-9; otherwise (1+mant/8)*2^(exp-7); S.1111.111 is NaN.
 * A literal table (checked against the definition by the unit tests), so no start-up code. */
const float e4m3_value_table[256] = {
    0.0f, 0x1p-9f, 0x1p-8f, 0x1.800p-8f, 0x1p-7f, 0x1.400p-7f, 0x1.800p-7f, 0x1.c00p-7f,
    0x1p-6f, 0x1.200p-6f, 0x1.400p-6f, 0x1.600p-6f, 0x1.800p-6f, 0x1.a00p-6f, 0x1.c00p-6f, 0x1.e00p-6f,
    0x1p-5f, 0x1.200p-5f, 0x1.400p-5f, 0x1.600p-5f, 0x1.800p-5f, 0x1.a00p-5f, 0x1.c00p-5f, 0x1.e00p-5f,
    0x1p-4f, 0x1.200p-4f, 0x1.400p-4f, 0x1.600p-4f, 0x1.800p-4f, 0x1.a00p-4f, 0x1.c00p-4f, 0x1.e00p-4f,
    0x1p-3f, 0x1.200p-3f, 0x1.400p-3f, 0x1.600p-3f, 0x1.800p-3f, 0x1.a00p-3f, 0x1.c00p-3f, 0x1.e00p-3f,
    0x1p-2f, 0x1.200p-2f, 0x1.400p-2f, 0x1.600p-2f, 0x1.800p-2f, 0x1.a00p-2f, 0x1.c00p-2f, 0x1.e00p-2f,
    0x1p-1f, 0x1.200p-1f, 0x1.400p-1f, 0x1.600p-1f, 0x1.800p-1f, 0x1.a00p-1f, 0x1.c00p-1f, 0x1.e00p-1f,
    0x1p+0f, 0x1.200p+0f, 0x1.400p+0f, 0x1.600p+0f, 0x1.800p+0f, 0x1.a00p+0f, 0x1.c00p+0f, 0x1.e00p+0f,
    0x1p+1f, 0x1.200p+1f, 0x1.400p+1f, 0x1.600p+1f, 0x1.800p+1f, 0x1.a00p+1f, 0x1.c00p+1f, 0x1.e00p+1f,
    0x1p+2f, 0x1.200p+2f, 0x1.400p+2f, 0x1.600p+2f, 0x1.800p+2f, 0x1.a00p+2f, 0x1.c00p+2f, 0x1.e00p+2f,
    0x1p+3f, 0x1.200p+3f, 0x1.400p+3f, 0x1.600p+3f, 0x1.800p+3f, 0x1.a00p+3f, 0x1.c00p+3f, 0x1.e00p+3f,
    0x1p+4f, 0x1.200p+4f, 0x1.400p+4f, 0x1.600p+4f, 0x1.800p+4f, 0x1.a00p+4f, 0x1.c00p+4f, 0x1.e00p+4f,
    0x1p+5f, 0x1.200p+5f, 0x1.400p+5f, 0x1.600p+5f, 0x1.800p+5f, 0x1.a00p+5f, 0x1.c00p+5f, 0x1.e00p+5f,
    0x1p+6f, 0x1.200p+6f, 0x1.400p+6f, 0x1.600p+6f, 0x1.800p+6f, 0x1.a00p+6f, 0x1.c00p+6f, 0x1.e00p+6f,
    0x1p+7f, 0x1.200p+7f, 0x1.400p+7f, 0x1.600p+7f, 0x1.800p+7f, 0x1.a00p+7f, 0x1.c00p+7f, 0x1.e00p+7f,
    0x1p+8f, 0x1.200p+8f, 0x1.400p+8f, 0x1.600p+8f, 0x1.800p+8f, 0x1.a00p+8f, 0x1.c00p+8f, NAN,
    -0.0f, -0x1p-9f, -0x1p-8f, -0x1.800p-8f, -0x1p-7f, -0x1.400p-7f, -0x1.800p-7f, -0x1.c00p-7f,
    -0x1p-6f, -0x1.200p-6f, -0x1.400p-6f, -0x1.600p-6f, -0x1.800p-6f, -0x1.a00p-6f, -0x1.c00p-6f, -0x1.e00p-6f,
    -0x1p-5f, -0x1.200p-5f, -0x1.400p-5f, -0x1.600p-5f, -0x1.800p-5f, -0x1.a00p-5f, -0x1.c00p-5f, -0x1.e00p-5f,
    -0x1p-4f, -0x1.200p-4f, -0x1.400p-4f, -0x1.600p-4f, -0x1.800p-4f, -0x1.a00p-4f, -0x1.c00p-4f, -0x1.e00p-4f,
    -0x1p-3f, -0x1.200p-3f, -0x1.400p-3f, -0x1.600p-3f, -0x1.800p-3f, -0x1.a00p-3f, -0x1.c00p-3f, -0x1.e00p-3f,
    -0x1p-2f, -0x1.200p-2f, -0x1.400p-2f, -0x1.600p-2f, -0x1.800p-2f, -0x1.a00p-2f, -0x1.c00p-2f, -0x1.e00p-2f,
    -0x1p-1f, -0x1.200p-1f, -0x1.400p-1f, -0x1.600p-1f, -0x1.800p-1f, -0x1.a00p-1f, -0x1.c00p-1f, -0x1.e00p-1f,
    -0x1p+0f, -0x1.200p+0f, -0x1.400p+0f, -0x1.600p+0f, -0x1.800p+0f, -0x1.a00p+0f, -0x1.c00p+0f, -0x1.e00p+0f,
    -0x1p+1f, -0x1.200p+1f, -0x1.400p+1f, -0x1.600p+1f, -0x1.800p+1f, -0x1.a00p+1f, -0x1.c00p+1f, -0x1.e00p+1f,
    -0x1p+2f, -0x1.200p+2f, -0x1.400p+2f, -0x1.600p+2f, -0x1.800p+2f, -0x1.a00p+2f, -0x1.c00p+2f, -0x1.e00p+2f,
    -0x1p+3f, -0x1.200p+3f, -0x1.400p+3f, -0x1.600p+3f, -0x1.800p+3f, -0x1.a00p+3f, -0x1.c00p+3f, -0x1.e00p+3f,
    -0x1p+4f, -0x1.200p+4f, -0x1.400p+4f, -0x1.600p+4f, -0x1.800p+4f, -0x1.a00p+4f, -0x1.c00p+4f, -0x1.e00p+4f,
    -0x1p+5f, -0x1.200p+5f, -0x1.400p+5f, -0x1.600p+5f, -0x1.800p+5f, -0x1.a00p+5f, -0x1.c00p+5f, -0x1.e00p+5f,
    -0x1p+6f, -0x1.200p+6f, -0x1.400p+6f, -0x1.600p+6f, -0x1.800p+6f, -0x1.a00p+6f, -0x1.c00p+6f, -0x1.e00p+6f,
    -0x1p+7f, -0x1.200p+7f, -0x1.400p+7f, -0x1.600p+7f, -0x1.800p+7f, -0x1.a00p+7f, -0x1.c00p+7f, -0x1.e00p+7f,
    -0x1p+8f, -0x1.200p+8f, -0x1.400p+8f, -0x1.600p+8f, -0x1.800p+8f, -0x1.a00p+8f, -0x1.c00p+8f, NAN,
};

uint8_t e4m3_encode_rne(float v) {
    uint8_t sign = (f32_bits(v) >> 31) ? 0x80 : 0;
    float a = fabsf(v);
    if (a < 0x1p-6f) {
        /* Subnormal range: a uniform grid of 2^-9; rintf rounds ties to even. m == 8 is the
         * smallest normal, whose code (exponent 1, mantissa 0) is also 8. */
        int m = (int)rintf(a * 512.0f);
        return (uint8_t)(sign | m);
    }
    int e = (int)((f32_bits(a) >> 23) & 0xff) - 127; /* -6 .. 8 */
    /* Scale to [8, 16): the three mantissa bits become the integer part. Exact (power of two). */
    float q = a * f32_from_bits((uint32_t)(3 - e + 127) << 23);
    int m = (int)rintf(q);
    if (m == 16) { m = 8; e++; }
    return (uint8_t)(sign | ((e + 7) << 3) | (m - 8));
}

const float e2m1_value_table[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

uint8_t e2m1_encode_rne(float v) {
    uint8_t sign = (f32_bits(v) >> 31) ? 8 : 0;
    float a = fabsf(v);
    /* E2M1 is a float with one mantissa bit: step 0.5 below 2, 1 in [2,4), 2 in [4,6]. Rounding
     * to the nearest grid point with rintf's ties-to-even on the step count gives ties to the
     * even code (.25->0, .75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4). */
    float r;
    if (a < 2.0f) r = rintf(a * 2.0f) * 0.5f;
    else if (a < 4.0f) r = rintf(a);
    else r = rintf(a * 0.5f) * 2.0f;
    uint8_t code;
    if (r < 2.0f) code = (uint8_t)(r * 2.0f);          /* 0, .5, 1, 1.5 -> 0..3 */
    else if (r < 4.0f) code = (uint8_t)(r + 2.0f);     /* 2, 3 -> 4, 5 */
    else code = r < 6.0f ? 6 : 7;                      /* 4 -> 6, 6 -> 7 */
    return sign | code;
}
