// The forms of DRF's browsable API that are submitted with JavaScript (the raw data
// form, PUT, PATCH, DELETE) send this render's idempotency key in the Idempotency-Key
// header; the HTML forms carry it in a hidden field. One key per rendered page.
(function ($) {
  var element = document.getElementById("idempotency_key");
  if (!element) {
    return;
  }
  var key = JSON.parse(element.textContent);
  var safe = /^(GET|HEAD|OPTIONS|TRACE)$/i;
  $(document).ajaxSend(function (event, xhr, settings) {
    if (!safe.test(settings.type)) {
      xhr.setRequestHeader("Idempotency-Key", key);
    }
  });
})(jQuery);
