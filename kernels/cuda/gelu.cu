// GELU, tanh approximation, elementwise with 16-byte loads (map2, common.cuh).
#include "kernels/cuda/common.cuh"

#define GELU_SCALE 0.7978845608028654f // sqrt(2 / pi)

struct GeluForward {
    __device__ float operator()(float x, float) const {
        float cube = 0.044715f * x * x * x;
        return 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
    }
};
// d/dx of the above: 0.5 (1 + tanh u) + 0.5 x sech^2(u) du/dx, u = sqrt(2/pi) (x + 0.044715 x^3).
struct GeluBackward {
    __device__ float operator()(float x, float dout) const {
        float u = GELU_SCALE * (x + 0.044715f * x * x * x);
        float tanh_u = tanhf(u);
        float sech2 = 1.0f - tanh_u * tanh_u;
        float local = 0.5f * (1.0f + tanh_u) + 0.5f * x * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
        return local * dout;
    }
};

// map2 takes two inputs; the forward ignores its second.
void gelu_forward(floatX* out, const floatX* inp, size_t n) { map2(out, inp, inp, n, GeluForward()); }
void gelu_backward(floatX* dinp, const floatX* inp, const floatX* dout, size_t n) {
    map2(dinp, inp, dout, n, GeluBackward());
}
