        if (m_new != m[t]) {  // also NaN, which then reaches l, mu, o and tt as in the decomposition
          float alpha = exp(m[t] - (m_new == neg_inf() ? 0.0 : m_new));
          l[t] *= alpha;
          mu[t] *= alpha;
          [[unroll]] for (uint g = 0u; g < DV4; ++g) { o[t * DV4 + g] *= alpha; tt[t * DV4 + g] *= alpha; }
          m[t] = m_new;
        }
