int kernel0(float* restrict a_in0, float* restrict a_in1, float* restrict a_out0, int64_t s0) {
    int64_t status = 0;
    #pragma omp parallel for if(parallel: 54*s0 >= 32768)
    for (int64_t i0 = 0; i0 < s0; i0++) {
        #pragma omp simd
        for (int64_t i1 = 0; i1 < 6; i1++) {
            float v0 = a_in0[(6*i0 + i1)];
            float v1 = a_in1[i1];
            float v2 = (v0 * v1);
            float v3 = (v2 + 1.5f);
            float v4 = (1.0f / (1.0f + expf(-v3)));
            a_out0[(6*i0 + i1)] = v4;
        }
    }
    return (int)(status != 0);
}
