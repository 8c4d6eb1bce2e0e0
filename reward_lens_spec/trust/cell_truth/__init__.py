"""Independent recomputations that some criteria read an output against, cell by cell (issue 37 item 7).

A criterion's ``cells(ds, org, obs)`` returns ``{output: (got, want)}``: each graded output's cells at full
strength beside the same cells recomputed here from plain HF forwards of the organism (batch of one, forward hooks,
float64 arithmetic; none of the capture, operator or executor code). ``trust.scorecard`` stores
``fit = 1 − max |got − want| / RMS(want)`` per output, and their minimum as the card's ``cells`` entry, which
must be ≥ ``CELL_FLOOR``
(``trust.evidence``), so a reading 5 % off, or one pair, member, rank or class shifted, fails the criterion
even where its summary (a ratio, a share, an AUC near chance) would pass.

==================  ======================================  ===================================================
criterion           cells compared                          recomputed by
==================  ======================================  ===================================================
steer_alignment     ``steer_slope``, ``steer_slope_head``    hook adds α·ρ·u at the readout token of the steered
                    per pair                                side at resid_post[layer]; least-squares slope of
                                                            the margin over the declared alphas (``np.polyfit``);
                                                            ρ = RMS norm of resid_post[layer] over every pair and
                                                            side, u = w_r (``direction: head``) or the mean
                                                            chosen − rejected output of the planted unit (input)
leace_specificity   ``displacement``,                       LEACE as the oblique projection
                    ``unplanted_displacement`` per pair     E = Σ_XZ (Σ_XZᵀ Σ_XX⁺ Σ_XZ)⁺ Σ_XZᵀ Σ_XX⁺ (Belrose et
                                                            al. 2023, eq. of Thm. 4.3 rewritten; pseudo-inverses,
                                                            no eigendecomposition), fitted on the seeded split
leace_removal       ``certificate`` estimates before /      the same split and eraser; the probe is L2 logistic
                    after erasure                           regression fitted by Newton's method (IRLS), AUC as
                                                            the Mann–Whitney U (``scipy.stats.mannwhitneyu``)
curvature_          ``margin_eigenvalues`` per pair (and    the dense Hessian of the reward w.r.t. a shift of
direction           side) and rank                          resid_post[layer] at the readout token
                                                            (``torch.autograd.functional.hessian``), its
                                                            eigenvalues (``np.linalg.eigvalsh``) by |λ|
==================  ======================================  ===================================================

Each raises ``ValueError`` naming what does not fit (a layer, a split size, a pair count), which the card
records as the criterion's reading error.

Modules: ``common`` (the fit, a step of the observable, the encoding, hooked plain forwards), ``leace`` (erasure
and its certificate), ``hooked`` (steering, curvature, attribution patching), ``summaries`` (the null and the
preference-structure summaries), ``reference_cells`` (group statistics, HodgeRank and path patching, read through
``trust.reference``: a workflow, so only the criteria that need it reach up to it).
"""
