// The sweep page's threshold: the slider and the number box move together; submitting the form
// reloads the page with ?threshold= (the policy is computed again; nothing is run again).
document.addEventListener("DOMContentLoaded", () => {
  const slider = document.getElementById("threshold-slider");
  const box = document.getElementById("threshold");
  if (!slider || !box) return;
  slider.value = box.value;  // start where the threshold is, never at the slider's minimum
  slider.addEventListener("input", () => { box.value = slider.value; });
  slider.addEventListener("change", () => { box.form.requestSubmit(); });
  box.addEventListener("input", () => { slider.value = box.value; });
});
