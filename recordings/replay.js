// Thumbnails reuse each step's data: URL (no second copy in the file);
// left and right arrow keys move between steps.
(function(){
  var steps=[].slice.call(document.querySelectorAll('.step'));
  var links=[].slice.call(document.querySelectorAll('#strip a'));
  links.forEach(function(a){
    var t=a.querySelector('.thumb'), img=document.querySelector('#step-'+a.dataset.n+' .shot img');
    if(t&&img){var i=document.createElement('img');i.src=img.src;i.alt='';t.replaceWith(i);}
  });
  var cur=0;
  function go(i){
    if(i<0||i>=steps.length)return;
    steps[cur].classList.remove('current');links[cur].classList.remove('current');
    cur=i;steps[i].classList.add('current');links[i].classList.add('current');
    steps[i].scrollIntoView({block:'start'});links[i].scrollIntoView({block:'nearest',inline:'nearest'});
  }
  links.forEach(function(a,i){a.addEventListener('click',function(e){e.preventDefault();go(i);});});
  document.addEventListener('keydown',function(e){
    if(e.key==='ArrowRight'||e.key==='j'){go(cur+1);e.preventDefault();}
    else if(e.key==='ArrowLeft'||e.key==='k'){go(cur-1);e.preventDefault();}
  });
  window.replayStep=function(){return steps.length?Number(steps[cur].dataset.n):-1;};
  if(steps.length){steps[0].classList.add('current');links[0].classList.add('current');}
})();
