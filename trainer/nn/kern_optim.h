/* Optimiser update kernels over type T (included twice by optim.c); n elements each,
 * contiguous. Conventions are torch's (torch.optim.SGD, Adam, AdamW). */

/* SGD: g = grad + wd p; buf = momentum buf + g (buf starts at 0, so it is g on the first
 * step); step along g + momentum buf (Nesterov) or buf; plain g when buf is NULL (no
 * momentum). The Nesterov choice is folded into two factors so the loop has no branch. */
TR_KERNEL static void S(sgd_update)(void *pv, const void *gv, void *bufv, int64_t n, double lr,
                                    double momentum, double wd, bool nesterov) {
  T *p = pv, *buf = bufv;
  const T *grad = gv;
  const T lr_t = (T)lr, mo = (T)momentum, wd_t = (T)wd;
  if (!buf) {
    TR_PAR_FOR(n, p[i] -= lr_t * (grad[i] + wd_t * p[i]););
    return;
  }
  const T from_g = nesterov ? 1 : 0, from_buf = nesterov ? mo : 1;
  /* one element: g, then the new buffer b, then the step */
  TR_PAR_FOR(n, T g = grad[i] + wd_t * p[i]; T b = mo * buf[i] + g; buf[i] = b;
             p[i] -= lr_t * (from_g * g + from_buf * b););
}

/* Adam (decoupled = false: wd added to the gradient) and AdamW (decoupled: p *= 1 - lr wd).
 * bc1, bc2 are the bias corrections 1 - beta^t. */
TR_KERNEL static void S(adam_update)(void *pv, const void *gv, void *mv, void *vv, int64_t n,
                                     double lr, double b1, double b2, double eps, double wd,
                                     bool decoupled, double bc1, double bc2) {
  T *p = pv, *m = mv, *v = vv;
  const T *grad = gv;
  const T step = (T)(lr / bc1), inv_sqrt_bc2 = (T)(1.0 / sqrt(bc2));
  const T decay = decoupled ? (T)(1 - lr * wd) : 1, coupled = decoupled ? 0 : (T)wd;
  TR_PAR_FOR(n, T g = grad[i] + coupled * p[i]; p[i] *= decay;
             m[i] = (T)b1 * m[i] + (T)(1 - b1) * g; v[i] = (T)b2 * v[i] + (T)(1 - b2) * g * g;
             p[i] -= step * m[i] / (sqrt(v[i]) * inv_sqrt_bc2 + (T)eps););
}
