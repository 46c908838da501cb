        float sc = sum4(s4[t]) * scale;
$MODIFIED
        float pr = (own(t) < $OWNCOUNT && kept($QI, $KJ) && sc != neg_inf()) ? exp(sc - $LSE) : 0.0;
