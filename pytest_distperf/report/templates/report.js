// Marks the page as drawn and records script errors in the DOM, so that a headless browser's --dump-dom shows
// both (the browser test reads them; no extra tooling needed).
window.__distperfErrors=[];
window.addEventListener('error',function(e){window.__distperfErrors.push(String(e.message||e));});
document.addEventListener('DOMContentLoaded',function(){
 var n=document.querySelectorAll('svg.chart').length;
 document.body.setAttribute('data-charts',String(n));
 document.body.setAttribute('data-errors',String(window.__distperfErrors.length));
 document.body.setAttribute('data-rendered','1');});
